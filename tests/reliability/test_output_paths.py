"""Where an output may go: a regular file or nothing, never through a link tempcal did not make, never into a
read-only file or folder (root included), and never onto another file the command reads or writes.

Each case is built the way a user meets it (``os.mknod``, ``os.symlink``, ``os.chmod(0o555)`` as root,
``GITHUB_STEP_SUMMARY`` naming SOURCE), and asserts exit 2, one ``error:`` line naming the path(s), and that
no file under the test's folder changed: bytes, type, mode, inode and link target alike.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import assert_one_error_line, id_ood_logits, numpy_logits, script_model, write_inputs, write_logits
from lm_eval_logs import NAME, random_mc_records, write_log
from safetensors.torch import save_file

from tempcal.output.files import STEP_SUMMARY_ENV

KEY = "tempcal.temperature"


def tree(folder: Path) -> dict[str, tuple]:
    """Every entry under ``folder`` as (type and mode, inode, device number, link target, bytes of a regular file)."""
    found: dict[str, tuple] = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            full = os.path.join(root, name)
            st = os.lstat(full)
            content = Path(full).read_bytes() if stat.S_ISREG(st.st_mode) else None
            link = os.readlink(full) if stat.S_ISLNK(st.st_mode) else None
            found[os.path.relpath(full, folder)] = (st.st_mode, st.st_ino, st.st_rdev, link, content)
    return found


@pytest.fixture
def refused(tmp_path, cli):
    """``refused(argv, *details)``: exit 2, one error line holding ``details``, nothing under tmp_path changed."""

    def run(argv: list[str], *details: str) -> str:
        before = tree(tmp_path)
        code, out, err = cli([str(a) for a in argv])
        assert code == 2, (code, out, err)
        line = assert_one_error_line(err, *map(str, details))
        assert tree(tmp_path) == before
        return line

    return run


@pytest.fixture
def logits(tmp_path) -> Path:
    """``l.safetensors``: overconfident logits and labels (as a user's validation logits)."""
    g = torch.Generator().manual_seed(0)
    z = 3 * torch.randn(300, 5, generator=g)
    y = torch.multinomial(torch.softmax(z / 3, 1), 1, generator=g)[:, 0]
    path = tmp_path / "l.safetensors"
    save_file({"logits": z, "labels": y}, str(path))
    return path


@pytest.fixture
def ood_pair(tmp_path) -> tuple[Path, Path]:
    z_id, y, z_ood = id_ood_logits(n_id=120, n_ood=80)
    save_file({"logits": z_id, "labels": y}, str(tmp_path / "id.safetensors"))
    save_file({"logits": z_ood}, str(tmp_path / "ood.safetensors"))
    return tmp_path / "id.safetensors", tmp_path / "ood.safetensors"


def mknod_null(path: Path) -> Path:
    """A character device like /dev/null (1, 3) at ``path``, as root makes it; skipped where that is not allowed."""
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except (PermissionError, AttributeError):
        pytest.skip("mknod needs root (CAP_MKNOD) here")
    return path


def command(name: str, logits: Path, ood_pair: tuple[Path, Path]) -> list:
    """``fit``/``report`` of ``logits``, or ``ood`` of the ID file against the OOD file."""
    if name == "ood":
        return ["ood", ood_pair[0], "--ood", ood_pair[1]]
    return [name, logits]


# -- 1. a device node, a pipe ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("flag", "name"), [("--output", "mynull"), ("--json", "mynull"), ("--markdown", "mynull"),
                                            ("--plot", "mynull.png")])
def test_fit_output_onto_a_character_device_is_refused(tmp_path, logits, refused, flag, name):
    node = mknod_null(tmp_path / name)
    line = refused(["fit", logits, flag, node], flag, node, "character device", "not a regular file")
    assert stat.S_ISCHR(os.lstat(node).st_mode)
    assert ("--json -" in line) == (flag == "--json")  # the way to standard output, where it applies


@pytest.mark.parametrize("name", ["report", "ood"])
def test_report_and_ood_json_onto_a_device_is_refused(tmp_path, logits, ood_pair, refused, name):
    node = mknod_null(tmp_path / "mynull")
    refused([*command(name, logits, ood_pair), "--json", node], "--json", node, "character device")


def test_json_through_a_link_to_a_device_is_refused_with_the_way_to_standard_output(tmp_path, logits, refused):
    """Like ``--json /dev/stdout`` (a link to /proc/self/fd/1): never renamed over; ``-`` is the way."""
    node = mknod_null(tmp_path / "tty")
    link = tmp_path / "stdout"
    os.symlink(node, link)
    refused(["fit", logits, "--json", link], "--json", link, "character device", "--json - writes to standard output")


def test_a_named_pipe_is_refused_without_blocking(tmp_path, logits, refused):
    fifo = tmp_path / "out.json"
    os.mkfifo(fifo)
    refused(["report", logits, "--json", fifo], fifo, "named pipe")


def test_a_sidecar_that_is_a_device_is_refused(tmp_path, refused):
    z, y = numpy_logits(n=200)
    data = write_logits("npz", tmp_path, z, y)
    side = mknod_null(tmp_path / "data.npz.tempcal.json")
    refused(["fit", data], side, "character device")


def test_a_step_summary_that_is_a_device_is_a_warning_and_left_alone(tmp_path, logits, cli, monkeypatch):
    node = mknod_null(tmp_path / "summary")
    monkeypatch.setenv(STEP_SUMMARY_ENV, str(node))
    before = os.lstat(node)
    code, out, err = cli(["report", str(logits), "--json", "-"])
    assert code == 0 and json.loads(out)["n"] == 300
    assert err.startswith(f"warning: ${STEP_SUMMARY_ENV} {node}: cannot open it to append the summary "
                          "(is a character device")
    after = os.lstat(node)
    assert (after.st_ino, after.st_mode, after.st_rdev) == (before.st_ino, before.st_mode, before.st_rdev)


# -- 2. symbolic links ----------------------------------------------------------------------------------------


@pytest.fixture
def downloaded(tmp_path) -> tuple[Path, Path]:
    """A downloaded log folder holding an lm-eval log whose ``FILE.tempcal.json`` links to a file of the user's."""
    folder = tmp_path / "downloaded"
    folder.mkdir()
    log = write_log(folder / NAME, random_mc_records(40, seed=3)[0])
    victim = tmp_path / "notes.txt"
    victim.write_text("the user's own notes\n")
    os.symlink(os.path.relpath(victim, folder), folder / f"{NAME}.tempcal.json")
    return log, victim


def test_a_planted_sidecar_link_is_refused_and_its_target_kept(downloaded, refused):
    log, victim = downloaded
    refused(["fit", log], f"{log}.tempcal.json", "symbolic link", "nothing written")
    assert victim.read_text() == "the user's own notes\n"


def test_a_planted_npz_sidecar_link_is_refused_even_with_other_outputs(tmp_path, refused):
    z, y = numpy_logits(n=200)
    data = write_logits("npz", tmp_path, z, y)
    victim = tmp_path / "victim.json"
    victim.write_text("{}")
    os.symlink(victim, tmp_path / "data.npz.tempcal.json")
    refused(["fit", data, "--json", tmp_path / "fit.json", "--markdown", tmp_path / "card.md"],
            tmp_path / "data.npz.tempcal.json", "symbolic link")


@pytest.mark.parametrize("flag", ["--output", "--json", "--markdown"])
def test_an_output_that_is_a_link_is_refused(tmp_path, logits, refused, flag):
    (tmp_path / "store").mkdir()
    target = tmp_path / "store" / "precious.safetensors"
    target.write_bytes(b"someone else's file")
    link = tmp_path / "link.safetensors"
    os.symlink(target, link)
    refused(["fit", logits, flag, link], flag, link, "symbolic link", "remove the link or name the file itself")


def test_a_dangling_link_output_is_refused(tmp_path, logits, refused):
    link = tmp_path / "out.json"
    os.symlink(tmp_path / "elsewhere" / "x.json", link)
    refused(["fit", logits, "--json", link], link, "symbolic link", "does not exist")


def test_an_output_copy_of_an_npz_through_a_link_is_refused(tmp_path, refused):
    z, y = numpy_logits(n=200)
    data = write_logits("npz", tmp_path, z, y)
    target = tmp_path / "theirs.npz"
    target.write_bytes(b"not ours")
    os.symlink(target, tmp_path / "copy.npz")
    refused(["fit", data, "--output", tmp_path / "copy.npz"], tmp_path / "copy.npz", "symbolic link")


def test_a_source_given_as_a_link_gets_t_in_the_file_it_names(tmp_path, logits, cli):
    """SOURCE named as a link is the user's choice: T goes into the file the link names, the link stays."""
    (tmp_path / "store").mkdir()
    real = tmp_path / "store" / "real.safetensors"
    logits.rename(real)
    link = tmp_path / "l.safetensors"
    os.symlink(real, link)
    code, out, err = cli(["fit", str(link), "--json", "-"])
    assert code == 0, err
    from safetensors import safe_open

    with safe_open(str(real), framework="pt") as f:
        assert float(f.metadata()[KEY]) == json.loads(out)["temperature"]
    assert link.is_symlink() and os.readlink(link) == str(real)


# -- 3. read-only folders and files, as root too ---------------------------------------------------------------


@pytest.fixture
def read_only(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    os.chmod(folder, 0o555)
    yield folder
    os.chmod(folder, 0o755)


@pytest.mark.parametrize("flag, name", [("--json", "fit.json"), ("--plot", "fit.png"), ("--markdown", "card.md"),
                                        ("--output", "out.safetensors")])
def test_fit_outputs_into_a_read_only_folder_are_refused(logits, read_only, refused, flag, name):
    """Nothing at all is written: not even T into SOURCE, which would come first."""
    refused(["fit", logits, flag, read_only / name], flag, read_only / name, "read-only", "0555")


def test_an_npz_output_copy_into_a_read_only_folder_is_refused(tmp_path, read_only, refused):
    z, y = numpy_logits(n=200)
    data = write_logits("npz", tmp_path, z, y)
    refused(["fit", data, "--output", read_only / "out.npz"], "--output", read_only / "out.npz", "read-only")


@pytest.mark.parametrize("flag, name", [("--json", "r.json"), ("--plot", "r.png"), ("--markdown", "r.md")])
def test_report_outputs_into_a_read_only_folder_are_refused(logits, read_only, refused, flag, name):
    refused(["report", logits, flag, read_only / name], flag, read_only / name, "read-only")


@pytest.mark.parametrize("flag, name", [("--json", "o.json"), ("--scores", "s.safetensors"), ("--plot", "o.png"),
                                        ("--markdown", "o.md")])
def test_ood_outputs_into_a_read_only_folder_are_refused(ood_pair, read_only, refused, flag, name):
    refused(["ood", ood_pair[0], "--ood", ood_pair[1], flag, read_only / name], flag, read_only / name, "read-only")


def test_a_read_only_json_file_is_refused(tmp_path, logits, refused):
    target = tmp_path / "fit.json"
    target.write_text("{}")
    os.chmod(target, 0o444)
    refused(["fit", logits, "--json", target], target, "read-only", "0444")


def test_a_read_only_npz_keeps_a_writable_sidecar(tmp_path, cli):
    """The sidecar is tempcal's own file: a read-only data file does not make a second fit refuse it."""
    z, y = numpy_logits(n=200)
    data = write_logits("npz", tmp_path, z, y)
    os.chmod(data, 0o444)
    for _ in range(2):
        code, _, err = cli(["fit", str(data), "--quiet"])
        assert code == 0, err
    assert stat.S_IMODE((tmp_path / "data.npz.tempcal.json").stat().st_mode) == 0o644


# -- 4. one file for two roles ----------------------------------------------------------------------------------


def test_json_onto_the_output_copy_is_refused(tmp_path, logits, refused):
    out = tmp_path / "out.safetensors"
    refused(["fit", logits, "--output", out, "--json", out], "--output", "--json", out)


def test_output_onto_source_itself_is_refused(logits, refused):
    refused(["fit", logits, "--output", logits], "--output", logits, "SOURCE")


def test_json_onto_a_hard_link_of_source_is_refused(tmp_path, logits, refused):
    alias = tmp_path / "alias.json"
    os.link(logits, alias)
    refused(["fit", logits, "--json", alias], "--json", alias, logits)


def test_json_onto_the_sidecar_of_source_is_refused(tmp_path, refused):
    z, y = numpy_logits(n=200)
    data = write_logits("npz", tmp_path, z, y)
    refused(["report", data, "--json", tmp_path / "data.npz.tempcal.json"], "--json", "sidecar of SOURCE")


def test_json_onto_the_configuration_file_is_refused(tmp_path, logits, refused, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tempcal.toml").write_text('source = "l.safetensors"\n')
    refused(["report", "--json", "tempcal.toml"], "--json", "tempcal.toml", "configuration file")


def test_json_onto_the_eval_file_is_refused(tmp_path, logits, refused):
    other = tmp_path / "eval.safetensors"
    other.write_bytes(logits.read_bytes())
    refused(["fit", logits, "--eval", other, "--json", other], "--json", other, "--eval")


def test_scores_onto_an_ood_file_is_refused(ood_pair, refused):
    ident, ood = ood_pair
    refused(["ood", ident, "--ood", ood, "--scores", ood], "--scores", ood, "--ood")


@pytest.fixture
def model(tmp_path, small) -> tuple[Path, Path]:
    """A TorchScript linear model and its inputs file."""
    inputs = small[2]
    torch.manual_seed(0)
    return script_model(torch.nn.Linear(5, 4), tmp_path / "net.pt"), inputs


@pytest.mark.parametrize("name", ["fit", "report"])
def test_save_logits_onto_the_inputs_is_refused(model, refused, name):
    net, inputs = model
    refused([name, net, "--inputs", inputs, "--save-logits", inputs], "--save-logits", inputs, "--inputs")


def test_save_logits_onto_the_saved_model_is_refused(tmp_path, model, refused):
    net, inputs = model
    out = tmp_path / "calibrated.pt"
    refused(["fit", net, "--inputs", inputs, "--save-model", out, "--save-logits", out], "--save-logits",
            "--save-model", out)


@pytest.mark.parametrize("name", ["fit", "report", "ood"])
def test_step_summary_naming_source_is_refused(logits, ood_pair, refused, monkeypatch, name):
    argv = command(name, logits, ood_pair)
    monkeypatch.setenv(STEP_SUMMARY_ENV, str(argv[1]))
    refused(argv, f"${STEP_SUMMARY_ENV}", argv[1], "SOURCE", "append")


def test_step_summary_naming_the_markdown_output_is_refused(tmp_path, logits, refused, monkeypatch):
    summary = tmp_path / "summary.md"
    summary.write_text("# Earlier steps\n")
    monkeypatch.setenv(STEP_SUMMARY_ENV, str(summary))
    refused(["report", logits, "--markdown", summary], "--markdown", f"${STEP_SUMMARY_ENV}", summary)


def test_files_of_one_name_in_two_folders_are_distinct(tmp_path, cli):
    """Distinct files with the same name in different folders are fine."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    z, y = numpy_logits(n=200)
    data = write_logits("npz", tmp_path / "a", z, y)
    np.savez(tmp_path / "b" / "data.npz", logits=z, labels=y)
    code, _, err = cli(["fit", str(data), "--output", str(tmp_path / "b" / "data.npz"), "--quiet"])
    assert code == 0, err


# -- 5. every file written is named --------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["fit", "report", "ood"])
def test_every_file_written_is_named(tmp_path, logits, ood_pair, cli, monkeypatch, name):
    summary = tmp_path / "summary.md"
    monkeypatch.setenv(STEP_SUMMARY_ENV, str(summary))
    files = {"--json": tmp_path / "r.json", "--plot": tmp_path / "r.png", "--markdown": tmp_path / "r.md"}
    argv = [*command(name, logits, ood_pair), *(str(a) for pair in files.items() for a in pair)]
    code, out, err = cli([str(a) for a in argv])
    assert code == 0, err
    for flag, path in files.items():
        assert path.is_file(), flag
    lines = out.splitlines()
    assert f"wrote the JSON to {files['--json']}" in lines
    assert f"wrote the plot to {files['--plot']}" in lines
    assert f"wrote the Markdown section to {files['--markdown']}" in lines
    assert f"appended the Markdown section to ${STEP_SUMMARY_ENV} ({summary})" in lines
    if name == "fit":
        assert any(line.startswith(f"wrote {KEY} = ") and line.endswith(str(logits)) for line in lines)
    quiet_code, quiet_out, _ = cli([*map(str, argv), "--quiet"])
    assert quiet_code == 0 and "wrote" not in quiet_out


def test_json_to_standard_output_stays_alone(tmp_path, logits, cli):
    code, out, err = cli(["report", str(logits), "--json", "-", "--markdown", str(tmp_path / "r.md")])
    assert code == 0, err
    assert json.loads(out)["n"] == 300 and (tmp_path / "r.md").is_file()
    assert "wrote" not in err


def test_saved_logits_are_named(tmp_path, model, cli):
    net, inputs = model
    out = tmp_path / "kept.safetensors"
    code, stdout, err = cli(["report", str(net), "--inputs", str(inputs), "--save-logits", str(out)])
    assert code == 0, err
    assert f"wrote the logits to {out}" in stdout.splitlines() and out.is_file()


def test_save_logits_onto_the_eval_inputs_is_refused(tmp_path, model, refused):
    """``--eval`` inputs that are the ``--save-logits`` target: refused (the evaluation inputs would be lost)."""
    net, inputs = model
    other = write_inputs(tmp_path / "eval.safetensors", torch.randn(20, 5), torch.randint(0, 4, (20,)))
    refused(["fit", net, "--inputs", inputs, "--eval", other, "--save-logits", other], "--save-logits", "--eval")
