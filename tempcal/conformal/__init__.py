"""Conformal prediction sets (``--conformal-alpha``), one capability, one package: ``sets`` the maths, ``passes`` the
chunk visitors and the memory policy, ``folds`` and ``report`` the commands' sets."""
