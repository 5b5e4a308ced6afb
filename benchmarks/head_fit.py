"""Fitting T from hidden states and an output head (``--head``) against one bare ``h @ W.T`` pass, and peers.

A language model's logits are too large to keep; tempcal computes them block by block from the final
hidden states and the output layer, so every read of the data is a full ``N x d x V`` matmul. This
script measures, in one run on the same data (default N = 20,000, d = 1,024, V = 32,000, float32):

* one bare chunked ``h @ W.T`` pass (the floor: the matmuls alone, same block size as tempcal);
* ``tempcal.fit_temperature`` on the hidden states and head: time, as a ratio to the bare pass (goal:
  at most 3.5), its ``passes``, and T against scipy's float64 optimum on the materialised logits;
* the whole ``tempcal fit hidden.safetensors --head head.safetensors`` command in a fresh process, with
  the default split and with ``--val-fraction 1``: time as a ratio to the bare pass (goal: at most 3.5;
  also net of a fresh process's start-up), its ``passes``, and the rows it pushes through ``h @ W.T``
  divided by N (counted in the process, so not moved by the machine's load); then, with ``--val-fraction
  1``, its peak resident memory (``VmHWM``) less that of a bare ``import torch`` process;
* what a user would otherwise do: materialise the logits chunk by chunk into a safetensors file
  (time and disk), then ``tempcal fit`` on that file; and the Guo et al. recipe (autograd L-BFGS
  on the whole logits tensor in memory), where memory allows.

A CUDA section repeats the tempcal fit and the bare pass on the GPU (TF32 off) when one is
available, and checks that T equals the CPU fit's to 1e-6; without CUDA it says it skipped.

Run: ``python benchmarks/head_fit.py [--rows 20000] [--width 1024] [--vocab 32000] [--skip-peers]``
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _machine import machine_lines

CHILD = """
import sys, time
import torch
if sys.argv[1] == "bare":
    sys.exit(0)
from tempcal.cli.main import main
from tempcal.models.head import OutputHead
if sys.argv[1] == "startup":
    sys.exit(0)
rows, plain = [0], OutputHead.logits
def logits(self, h, out):
    rows[0] += h.shape[0]  # every row pushed through h @ W.T, whichever pass asked for it
    return plain(self, h, out)
OutputHead.logits = logits
code = main(sys.argv[1:])
with open("/proc/self/status") as f:
    peak = next(line.split()[1] for line in f if line.startswith("VmHWM:"))
print("peak_kb", peak, file=sys.stderr)
print("head_rows", rows[0], file=sys.stderr)
sys.exit(code)
"""


def make_data(folder: Path, rows: int, width: int, vocab: int, seed: int = 0) -> tuple[Path, Path]:
    """Hidden states and a head whose logits are overconfident by about 2.5, labels drawn from the truth."""
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(vocab, width, generator=g) / width**0.5 * 3
    bias = torch.randn(vocab, generator=g) * 0.1
    hidden = torch.randn(rows, width, generator=g)
    labels = torch.empty(rows, dtype=torch.int64)
    for start in range(0, rows, 512):
        z = hidden[start:start + 512] @ weight.T + bias
        labels[start:start + 512] = torch.multinomial(torch.softmax(z / 2.5, 1), 1, generator=g)[:, 0]
    save_file({"hidden": hidden, "labels": labels}, str(folder / "hidden.safetensors"))
    save_file({"weight": weight, "bias": bias}, str(folder / "head.safetensors"))
    return folder / "hidden.safetensors", folder / "head.safetensors"


def bare_pass(hidden: torch.Tensor, head, chunk_rows: int, device: torch.device) -> float:
    """Seconds for one chunked ``h @ W.T + b`` over every row, into one reused block (the floor)."""
    from tempcal.core.precision import no_tf32

    weight, bias = head.weight.to(device), head.bias.to(device)
    block = torch.empty(chunk_rows, head.vocab, device=device)
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    with no_tf32():
        for first in range(0, hidden.shape[0], chunk_rows):
            h = hidden[first:first + chunk_rows].to(device)
            out = block[: h.shape[0]]
            torch.matmul(h, weight.T, out=out)
            out.add_(bias)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def tempcal_fit(hidden_path: Path, head_path: Path, device: str) -> tuple[float, object, object]:
    """Seconds, the FitResult and the source of ``fit_temperature`` on every row (validating scan included)."""
    import tempcal

    start = time.perf_counter()
    source = tempcal.open_source(hidden_path, head=str(head_path))
    scan = tempcal.Scan(source.data, device=device)
    result = tempcal.fit_temperature(scan)
    return time.perf_counter() - start, result, source


def command(args: list[str]) -> tuple[float, float, str]:
    """Seconds, peak RSS (MB) and standard output of ``tempcal ARGS`` (or a bare torch import) in a fresh process."""
    seconds, stderr, stdout = _child(args)
    return seconds, _reported(stderr, "peak_kb") / 1024, stdout


def _child(args: list[str]) -> tuple[float, str, str]:
    """Seconds, standard error and standard output of :data:`CHILD` run with ``args`` in a fresh process."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"tempcal {' '.join(args)} failed: {done.stderr[-500:]}")
    return seconds, done.stderr, done.stdout


def _reported(stderr: str, name: str) -> float:
    """The number :data:`CHILD` printed after ``name`` on standard error (NaN when it printed none)."""
    words = stderr.split(name)[-1].split() if name in stderr else []
    return float(words[0]) if words and words[0].isdigit() else float("nan")


def whole_command(hidden_path: Path, head_path: Path, split: list[str], bare: Callable[[], float], rows: int,
                  startup: float) -> tuple[str, float]:
    """One line on the whole ``tempcal fit --head`` command with ``split``: seconds and bare passes (the floor timed
    just before and just after it, against a machine's drifting load; also net of a fresh process's start-up), the
    JSON's ``passes``, and the rows it pushed through ``h @ W.T`` per row of SOURCE (counted in the process: the
    figure the machine's load does not move); and its peak RSS (MB)."""
    before = bare()
    seconds, stderr, stdout = _child(["fit", str(hidden_path), "--head", str(head_path), "--no-write", "--json", "-",
                                      "--device", "cpu", *split])
    floor = (before + bare()) / 2
    report = json.loads(stdout)
    multiplied = _reported(stderr, "head_rows")
    fit = rows + (report["passes"] - 1) * report["n_fit"]  # the validating scan, then the fit's reads of its rows
    line = (f"tempcal fit command {' '.join(split) or '(default split, val-fraction 0.5)'}: {seconds:.1f} s = "
            f"{seconds / floor:.2f} bare passes of {floor:.2f} s ({(seconds - startup) / floor:.2f} net of start-up; "
            f"goal <= 3.5); "
            f"{report['passes']} passes in its JSON; h @ W.T rows {multiplied:,.0f} = {multiplied / rows:.3f} N: "
            f"the fit's {fit / rows:.3f} N, then {(multiplied - fit) / rows:.3f} N "
            f"({report['n_eval']:,} evaluation rows = {report['n_eval'] / rows:.3f} N)")
    return line, _reported(stderr, "peak_kb") / 1024


def bare_torch_rss() -> float:
    code = ("import torch\nwith open('/proc/self/status') as f:\n"
            "    print(next(line.split()[1] for line in f if line.startswith('VmHWM:')))")
    return int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout) / 1024


def materialise(hidden: torch.Tensor, labels: torch.Tensor, head, path: Path, chunk_rows: int) -> float:
    """Seconds to write the logits, chunk by chunk, as a safetensors file (header first, then the blocks)."""
    import struct

    rows, vocab = hidden.shape[0], head.vocab
    logits_bytes = rows * vocab * 4
    header = {"logits": {"dtype": "F32", "shape": [rows, vocab], "data_offsets": [0, logits_bytes]},
              "labels": {"dtype": "I64", "shape": [rows], "data_offsets": [logits_bytes, logits_bytes + rows * 8]}}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    block = torch.empty(chunk_rows, vocab)
    start = time.perf_counter()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for first in range(0, rows, chunk_rows):
            out = head.logits(hidden[first:first + chunk_rows], block[: min(chunk_rows, rows - first)])
            f.write(out.numpy().tobytes())
        f.write(labels.numpy().tobytes())
    return time.perf_counter() - start


def guo_lbfgs(logits: torch.Tensor, labels: torch.Tensor) -> tuple[float, float, int]:
    """Guo et al.'s recipe (``peers/guo_lbfgs.py``) on the whole logits tensor: seconds, T, closure calls."""
    sys.path.insert(0, str(Path(__file__).resolve().parent / "peers"))
    from guo_lbfgs import load

    start = time.perf_counter()
    temperature, calls = load(None).fit((logits, labels))
    return time.perf_counter() - start, temperature, calls


def reference_t(hidden: torch.Tensor, labels: torch.Tensor, head, chunk_rows: int) -> float:
    """scipy's bounded optimiser on log T in float64, the NLL summed chunk by chunk over the float32 logits."""
    from scipy.optimize import minimize_scalar

    block = torch.empty(chunk_rows, head.vocab)

    def nll(log_t: float) -> float:
        total = 0.0
        for first in range(0, hidden.shape[0], chunk_rows):
            z = head.logits(hidden[first:first + chunk_rows], block[: min(chunk_rows, hidden.shape[0] - first)])
            z = z.double() / float(torch.tensor(log_t).exp())
            y = labels[first:first + chunk_rows]
            total += float((torch.logsumexp(z, 1) - z.gather(1, y[:, None])[:, 0]).sum())
        return total / hidden.shape[0]

    found = minimize_scalar(nll, bounds=(-3, 3), method="bounded", options={"xatol": 1e-10})
    return float(torch.tensor(found.x, dtype=torch.float64).exp())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=32_000)
    parser.add_argument("--skip-peers", action="store_true", help="only tempcal and the bare pass")
    parser.add_argument("--no-reference", action="store_true", help="skip scipy's float64 optimum (slow)")
    args = parser.parse_args()
    import tempcal
    from tempcal.models.head import load_head

    print("\n".join(machine_lines()))
    folder = Path(tempfile.mkdtemp(prefix="tempcal-head-bench-"))
    try:
        hidden_path, head_path = make_data(folder, args.rows, args.width, args.vocab)
        head = load_head(head_path)
        opened = tempcal.open_source(hidden_path, head=str(head_path))
        chunk_rows = opened.data.default_chunk_rows(torch.device("cpu"))
        rows = load_file(str(hidden_path))["hidden"]
        labels = opened.data.labels
        size = f"N = {args.rows:,}, d = {args.width:,}, V = {args.vocab:,} float32"
        megabytes = [p.stat().st_size / 1e6 for p in (hidden_path, head_path)]
        print(f"{size}; hidden {megabytes[0]:.0f} MB, head {megabytes[1]:.0f} MB, {chunk_rows} rows a block")
        floor = min(bare_pass(rows, head, chunk_rows, torch.device("cpu")) for _ in range(2))
        seconds, result, _ = tempcal_fit(hidden_path, head_path, "cpu")
        print(f"bare h @ W.T pass: {floor:.2f} s")
        print(f"tempcal fit_temperature: {seconds:.2f} s = {seconds / floor:.2f} bare passes (goal <= 3.5); "
              f"{result.passes} passes; T = {result.temperature:.8f}")
        if not args.no_reference:
            t_ref = reference_t(rows, labels, head, chunk_rows)
            error = abs(result.temperature - t_ref) / t_ref
            print(f"scipy float64 optimum: T = {t_ref:.8f}; relative error {error:.1e}")
        startup = min(_child(["startup"])[0] for _ in range(2))
        print(f"fresh process start-up (import torch and tempcal's command line, then exit): {startup:.2f} s")
        for split in ([], ["--val-fraction", "1"]):
            line, peak = whole_command(hidden_path, head_path, split,
                                       lambda: bare_pass(rows, head, chunk_rows, torch.device("cpu")), args.rows,
                                       startup)
            print(line)
        base = bare_torch_rss()
        budget = (hidden_path.stat().st_size + head_path.stat().st_size) / 2**20 + 256
        print(f"tempcal fit command --val-fraction 1: peak RSS {peak:.0f} MB, {peak - base:.0f} MB above a bare "
              f"import torch ({base:.0f} MB); budget size(head) + size(hidden) + 256 MB = {budget:.0f} MB; "
              f"materialised logits would be {args.rows * args.vocab * 4 / 2**20:.0f} MB")
        if not args.skip_peers:
            logits_path = folder / "logits.safetensors"
            write_s = materialise(rows, labels, head, logits_path, chunk_rows)
            disk = logits_path.stat().st_size / 1e9
            fit_s, peak_l, out_l = command(["fit", str(logits_path), "--no-write", "--json", "-", "--device", "cpu",
                                            "--val-fraction", "1"])
            print(f"materialise to safetensors: {write_s:.1f} s, {disk:.2f} GB on disk; then tempcal fit on it: "
                  f"{fit_s:.1f} s ({json.loads(out_l)['passes']} passes, peak RSS {peak_l:.0f} MB); "
                  f"together {(write_s + fit_s) / seconds:.1f}x tempcal's fit from the head")
            logits = load_file(str(logits_path))["logits"]
            guo_s, guo_t, calls = guo_lbfgs(logits, labels)
            print(f"Guo et al. recipe on the materialised logits in memory: {guo_s:.1f} s, {calls} passes, "
                  f"T = {guo_t:.6f} (its lr = 0.01, 50 iterations stop short of the optimum)")
        if torch.cuda.is_available():
            gpu = torch.device("cuda")
            floor_gpu = min(bare_pass(rows, head, opened.data.default_chunk_rows(gpu), gpu) for _ in range(3))
            seconds_gpu, result_gpu, _ = tempcal_fit(hidden_path, head_path, "cuda")
            print(f"CUDA: bare pass {floor_gpu:.3f} s; fit {seconds_gpu:.3f} s = {seconds_gpu / floor_gpu:.2f} bare "
                  f"passes; T = {result_gpu.temperature:.8f}, relative to the CPU fit "
                  f"{abs(result_gpu.temperature - result.temperature) / result.temperature:.1e} (goal <= 1e-6)")
        else:
            print("CUDA: skipped (torch reports no CUDA device)")
    finally:
        for path in folder.iterdir():
            path.unlink()
        folder.rmdir()


if __name__ == "__main__":
    main()
