"""Page-cache eviction and residency on a real file (the mechanism behind cold starts)."""

import os
from pathlib import Path

import pytest

from onboarding.serving import page_cache


@pytest.fixture
def data_file() -> Path:
    # Not tmp_path: it may be a tmpfs, where pages cannot be evicted. The repo's disk can.
    from onboarding.common.paths import PROJECT_ROOT

    d = PROJECT_ROOT / ".data" / "test-page-cache"
    d.mkdir(parents=True, exist_ok=True)
    p = d / f"weights-{os.getpid()}.bin"
    p.write_bytes(os.urandom(8 << 20))
    os.sync()
    yield p
    p.unlink()


def test_evict_then_read_then_residency(data_file):
    cold = page_cache.make_cold([data_file])
    assert cold.fraction < 0.05 and cold.total_bytes == 8 << 20
    raw = page_cache.sequential_read([data_file], block=1 << 20)
    assert raw.total_bytes == 8 << 20 and raw.gbps > 0
    assert page_cache.residency([data_file]).fraction > 0.95
    page_cache.evict([data_file])
    assert page_cache.residency([data_file]).fraction < 0.05
    assert page_cache.make_warm([data_file]).fraction > 0.95


def test_empty_file_counts_as_resident(tmp_path):
    p = tmp_path / "empty"
    p.touch()
    assert page_cache.file_residency(p).total_bytes == 0
    assert page_cache.residency([p]).fraction == 1.0


def test_a_mapped_file_cannot_be_made_cold_and_the_error_names_the_holder(data_file):
    import mmap

    with open(data_file, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        m.read()  # fault every page in through the mapping
        with pytest.raises(page_cache.PageCacheError, match="this process"):
            page_cache.make_cold([data_file])
