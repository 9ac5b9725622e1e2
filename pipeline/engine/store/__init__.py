"""The artifact store: immutable, content-verified folders named by stage and fingerprint.

Layout under the store root:
    objects/<stage>-<fingerprint16>/   complete artifacts (manifest.json written last)
    tmp/                                artifacts being written (renamed into objects/ when done)
    work/<id>/                          a stage's scratch space that survives a crash (checkpoints)
    quarantine/                         artifacts that failed verification, kept for inspection
    runs/<run-id>.json                  one log per `pipeline run`
    latest/<recipe>@<h>.json            what the latest run of each recipe file used
    builds/<stage>-<fingerprint16>.json forced rebuilds of that fingerprint, each under its own id
    lock                                held (flock) by the process writing to the store
    readers.lock                        held shared by commands reading, exclusively by gc

One module a job (as DVC keeps its lock, rwlock, gc and cache apart): ids (fingerprints, ids,
manifests' constants, Artifact), verify (a folder against its file list), commit (atomic writes,
tmp/, work/, quarantine/), rebuilds (builds/), pointers (runs/, latest/), gc, locks, and the
`Store` facade (facade.py) that ties them to one root. The names below are what the rest of the
project imports from here; the store knows no stage and no metric.
"""

from __future__ import annotations

from .commit import write_json_atomic
from .facade import Store
from .gc import Garbage, tree_bytes
from .ids import (
    FORMAT,
    ID_RE,
    MANIFEST,
    MAX_MANIFEST_BYTES,
    Artifact,
    artifact_id,
    canonical_json,
    default_root,
    fingerprint,
    now_iso,
    safe_name,
    tool_versions,
)
from .locks import WORK_LOCK, hold_work_dir, work_dir_holder
from .verify import file_record, listed_file_problems, verify_folder

_ID_RE = ID_RE  # the name `pipeline artifacts` imports

__all__ = [
    "FORMAT",
    "ID_RE",
    "MANIFEST",
    "MAX_MANIFEST_BYTES",
    "WORK_LOCK",
    "Artifact",
    "Garbage",
    "Store",
    "artifact_id",
    "canonical_json",
    "default_root",
    "file_record",
    "fingerprint",
    "hold_work_dir",
    "listed_file_problems",
    "now_iso",
    "safe_name",
    "tool_versions",
    "tree_bytes",
    "verify_folder",
    "work_dir_holder",
    "write_json_atomic",
]
