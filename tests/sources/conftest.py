"""A real S3-compatible server on the loopback address (moto's, in a thread of the test
process: diffract_sources_fsspec.loopback), started and stopped by the tests, counting
the bytes of every object it sends. Every process a test starts (the command line, pool
and Ray workers) finds it through ``AWS_ENDPOINT_URL`` and dummy keys in the environment."""

from __future__ import annotations

import os

import pytest

# gcsfs's experimental zonal-bucket probe asks GCS over gRPC and TLS, which an emulator
# on the loopback address cannot answer (a minute of timeouts per bucket): off here
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

pytest.importorskip("s3fs")
pytest.importorskip("moto")


@pytest.fixture(scope="session")
def s3_server():
    from diffract_sources_fsspec.loopback import LoopbackS3

    with LoopbackS3() as server:
        yield server


@pytest.fixture
def s3(s3_server):
    s3_server.reset()
    return s3_server
