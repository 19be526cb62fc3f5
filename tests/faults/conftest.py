"""Fixtures the fault tests share with the rest of the suite."""
from tests.service.test_clear_failures import small_disk  # noqa: F401 (a 3 MiB tmpfs, root only)
