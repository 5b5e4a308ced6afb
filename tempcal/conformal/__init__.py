"""Conformal prediction sets (``--conformal-alpha``), one capability, one package: ``sets`` the maths, ``passes`` the
chunk visitors and the memory policy, ``commands`` the sets ``fit`` and ``report`` form."""
