"""Dask's own conformance suite for foreign ``get`` functions, on real worker processes."""

from __future__ import annotations

import pytest
from dask.utils_test import GetFunctionTestMixin

pytestmark = pytest.mark.integration


class TestManagerGet(GetFunctionTestMixin):
    @pytest.fixture(autouse=True)
    def _use_manager(self, shared_manager):
        self.get = shared_manager.get
