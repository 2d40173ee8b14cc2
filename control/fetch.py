"""`bench fetch`: download a campaign's results, resumably, and check each shard's tarball.

`s3://<bucket>/results/<campaign>/<shard>/...` lands in `<dir>/<shard>/...`
(`jobs/<job>/...` as each job finished, then `manifest.json` and `results.tar.gz`).

- A local file with the object's size and checksum is skipped. The checksum is the best one
  S3 reports: a full-object SHA-256 or CRC32 (`ChecksumMode=ENABLED`), else the ETag, which
  for SSE-S3 objects is the MD5 of a single-part upload or, for a multipart one, the MD5 of
  the parts' MD5s (recomputed locally with the part size from `HeadObject(PartNumber=1)`).
- A download goes to `<file>.<etag-id>.part` and is renamed only once its checksum matches;
  an interrupted one resumes from the part file's length with a ranged GET pinned to the same
  ETag (`IfMatch`), so a changed object restarts instead of splicing two versions.
- Each shard's tarball (`results.tar.gz`: the shard folder, packed by the agent at its end)
  is opened and checked against the shard's `manifest.json`: the manifest inside equals the
  one uploaded, every file the manifest lists (when it lists files with sizes or SHA-256s)
  is in the tarball with that size and digest, no member escapes the folder, and every
  member that was also uploaded on its own (the job folders) is byte-identical to it.
"""

from __future__ import annotations

import base64
import glob
import hashlib
import json
import tarfile
import zlib
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from botocore.exceptions import BotoCoreError, ClientError

from contract.files import sha256_file
from contract.layout import MANIFEST_FILE, TARBALL_FILE, results_prefix, spec_key
from control.aws import AwsClients
from control.errors import ControlError

__all__ = [
    "FetchReport",
    "FileOutcome",
    "TarballCheck",
    "fetch_campaign",
    "verify_tarball",
]

_CHUNK = 1 << 20
_PARALLEL_DOWNLOADS = 8


@dataclass(frozen=True, slots=True)
class FileOutcome:
    """One object.

    Attributes:
        rel: its path under the campaign folder (`<shard>/...`).
        outcome: skipped (already here, same size and checksum), downloaded, resumed (from a
            part file), or failed.
        size: its size in bytes.
        checksum: which checksum was compared (sha256, crc32, md5, multipart-md5, size).
        error: why it failed.
    """

    rel: str
    outcome: Literal["skipped", "downloaded", "resumed", "failed"]
    size: int
    checksum: str
    error: str | None = None


@dataclass(frozen=True, slots=True)
class TarballCheck:
    """One shard's tarball checked against its manifest.

    Attributes:
        shard: the shard.
        tarball: its path under the campaign folder; None if the shard has none yet.
        members: files in the tarball.
        problems: what does not match (empty: verified).
        notes: remarks that are not failures.
    """

    shard: str
    tarball: str | None
    members: int = 0
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool | None:
        return None if self.tarball is None else not self.problems


@dataclass(frozen=True, slots=True)
class FetchReport:
    """The result of `fetch_campaign`.

    Attributes:
        campaign: its name.
        dest: the local campaign folder.
        files: one outcome per object.
        tarballs: one check per shard.
    """

    campaign: str
    dest: Path
    files: tuple[FileOutcome, ...]
    tarballs: tuple[TarballCheck, ...]

    def count(self, outcome: str) -> int:
        return sum(1 for f in self.files if f.outcome == outcome)

    @property
    def ok(self) -> bool:
        return self.count("failed") == 0 and all(t.ok is not False for t in self.tarballs)


@dataclass(frozen=True, slots=True)
class _Digest:
    kind: Literal["sha256", "crc32", "md5", "multipart-md5", "size"]
    value: str = ""
    part_size: int = 0


def fetch_campaign(
    clients: AwsClients,
    bucket: str,
    campaign: str,
    dest: Path,
    *,
    on_file: Callable[[FileOutcome], None] = lambda outcome: None,
) -> FetchReport:
    """Download every object under `results/<campaign>/` into `dest`, then check tarballs.

    Raises:
        ControlError: the campaign has neither results nor a spec in the bucket.
    """
    try:
        prefix = results_prefix(campaign)
    except ValueError as exc:
        raise ControlError(str(exc)) from exc
    s3 = clients.client("s3")
    objects = [
        (obj["Key"], int(obj["Size"]))
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        for obj in page.get("Contents", [])
        if not obj["Key"].endswith("/")
    ]
    if not objects and not _exists(s3, bucket, spec_key(campaign)):
        raise ControlError(
            f"campaign {campaign!r} not found in s3://{bucket}/: no results under {prefix} and "
            f"no spec at {spec_key(campaign)}"
        )
    dest.mkdir(parents=True, exist_ok=True)

    def one(item: tuple[str, int]) -> FileOutcome:
        key, size = item
        rel = key[len(prefix) :]
        try:
            local = _safe_path(dest, rel)
            outcome = _fetch_one(s3, bucket, key, rel, local)
        except (ClientError, BotoCoreError, OSError, ValueError) as exc:
            outcome = FileOutcome(rel, "failed", size, "-", " ".join(str(exc).split()))
        on_file(outcome)
        return outcome

    with ThreadPoolExecutor(max_workers=_PARALLEL_DOWNLOADS) as pool:
        files = tuple(pool.map(one, objects))
    fetched = {f.rel for f in files if f.outcome != "failed"}
    shards = sorted({key[len(prefix) :].split("/", 1)[0] for key, _ in objects})
    tarballs = tuple(_check_shard(dest, shard, fetched) for shard in shards)
    return FetchReport(campaign, dest, files, tarballs)


def _exists(s3: Any, bucket: str, key: str) -> bool:
    try:
        s3.head_object(Bucket=bucket, Key=key)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in {"404", "NoSuchKey", "NotFound"}:
            return False
        raise
    return True


def _safe_path(dest: Path, rel: str) -> Path:
    parts = PurePosixPath(rel).parts
    if not parts or rel.startswith("/") or any(p in {"..", ""} for p in parts):
        raise ValueError(f"refusing object key outside the campaign folder: {rel!r}")
    return dest.joinpath(*parts)


def _fetch_one(s3: Any, bucket: str, key: str, rel: str, local: Path) -> FileOutcome:
    head = s3.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    size = int(head["ContentLength"])
    etag = str(head.get("ETag", ""))
    digest = _remote_digest(s3, bucket, key, head)
    if local.is_file() and local.stat().st_size == size and _matches(local, digest):
        return FileOutcome(rel, "skipped", size, digest.kind)
    local.parent.mkdir(parents=True, exist_ok=True)
    part = local.with_name(f"{local.name}.{hashlib.sha1(etag.encode()).hexdigest()[:12]}.part")
    for stale in local.parent.glob(f"{glob.escape(local.name)}.*.part"):
        if stale != part:
            stale.unlink(missing_ok=True)
    resumed = part.is_file() and 0 < part.stat().st_size <= size
    if part.is_file() and not resumed:
        part.unlink()
    for first_try in (True, False):
        _download(s3, bucket, key, etag, part, size)
        if _matches(part, digest):
            part.replace(local)
            return FileOutcome(rel, "resumed" if resumed else "downloaded", size, digest.kind)
        part.unlink(missing_ok=True)  # a bad resume or a bad transfer: once more from zero
        resumed = False
        if not first_try:
            break
    raise ValueError(f"{rel}: {digest.kind} checksum still differs after downloading it twice")


def _download(s3: Any, bucket: str, key: str, etag: str, part: Path, size: int) -> None:
    offset = part.stat().st_size if part.is_file() else 0
    if offset >= size and size > 0:
        return
    request: dict[str, Any] = {"Bucket": bucket, "Key": key}
    if etag:
        request["IfMatch"] = etag
    if offset:
        request["Range"] = f"bytes={offset}-"
    try:
        body = s3.get_object(**request)["Body"]
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") == "PreconditionFailed":
            raise ValueError(f"{key} changed while it was being fetched; run fetch again") from exc
        raise
    with part.open("ab" if offset else "wb") as out:
        for chunk in body.iter_chunks(_CHUNK):
            out.write(chunk)


def _remote_digest(s3: Any, bucket: str, key: str, head: Mapping[str, Any]) -> _Digest:
    full_object = head.get("ChecksumType", "FULL_OBJECT") == "FULL_OBJECT"
    sha256 = head.get("ChecksumSHA256")
    if sha256 and "-" not in sha256 and full_object:
        return _Digest("sha256", sha256)
    crc32 = head.get("ChecksumCRC32")
    if crc32 and "-" not in crc32 and full_object:
        return _Digest("crc32", crc32)
    etag = str(head.get("ETag", "")).strip('"')
    if etag and "-" not in etag and len(etag) == 32:
        return _Digest("md5", etag)
    if "-" in etag:
        part_size = int(s3.head_object(Bucket=bucket, Key=key, PartNumber=1)["ContentLength"])
        return _Digest("multipart-md5", etag, part_size)
    return _Digest("size")


def _matches(path: Path, digest: _Digest) -> bool:
    if digest.kind == "size":
        return True
    if digest.kind == "sha256":
        sha = hashlib.sha256()
        for chunk in _chunks(path):
            sha.update(chunk)
        return base64.b64encode(sha.digest()).decode() == digest.value
    if digest.kind == "crc32":
        crc = 0
        for chunk in _chunks(path):
            crc = zlib.crc32(chunk, crc)
        return base64.b64encode(crc.to_bytes(4, "big")).decode() == digest.value
    if digest.kind == "md5":
        md5 = hashlib.md5(usedforsecurity=False)
        for chunk in _chunks(path):
            md5.update(chunk)
        return md5.hexdigest() == digest.value
    part_digests: list[bytes] = []
    with path.open("rb") as f:
        while block := f.read(digest.part_size):
            part_digests.append(hashlib.md5(block, usedforsecurity=False).digest())
    combined = hashlib.md5(b"".join(part_digests), usedforsecurity=False).hexdigest()
    return f"{combined}-{len(part_digests)}" == digest.value


def _chunks(path: Path) -> Iterable[bytes]:
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            yield chunk


def _check_shard(dest: Path, shard: str, fetched: set[str]) -> TarballCheck:
    tarball = f"{shard}/{TARBALL_FILE}"
    if tarball not in fetched:
        return TarballCheck(shard, None, notes=("no tarball yet (the agent packs it at the end)",))
    loose = {
        rel[len(shard) + 1 :]: dest / rel
        for rel in fetched
        if rel.startswith(f"{shard}/") and rel != tarball
    }
    return verify_tarball(shard, tarball, dest / tarball, loose)


def verify_tarball(
    shard: str, tarball_rel: str, tarball: Path, loose: Mapping[str, Path]
) -> TarballCheck:
    """Check a shard's tarball against its manifest and its separately uploaded files.

    Args:
        shard: the shard.
        tarball_rel: the tarball's path under the campaign folder (for messages).
        tarball: the local tarball.
        loose: path within the shard folder -> local file, for the files uploaded one by one
            (`manifest.json` among them).
    """
    problems: list[str] = []
    notes: list[str] = []
    try:
        members = _read_members(tarball)
    except (tarfile.TarError, OSError, EOFError) as exc:
        return TarballCheck(shard, tarball_rel, problems=(f"cannot read the tarball: {exc}",))
    unsafe = [name for name in members if name.startswith("/") or ".." in name.split("/")]
    problems += [f"member {name!r} escapes the shard folder" for name in unsafe]
    members = _strip_top(members)

    manifest_file = loose.get(MANIFEST_FILE)
    inner = members.get(MANIFEST_FILE)
    manifest: Any = None
    if manifest_file is None:
        problems.append(f"no {MANIFEST_FILE} uploaded beside the tarball")
    else:
        try:
            manifest = json.loads(manifest_file.read_bytes())
        except (json.JSONDecodeError, UnicodeDecodeError):
            problems.append(f"{MANIFEST_FILE} is not JSON")
    if inner is None:
        problems.append(f"the tarball holds no {MANIFEST_FILE}")
    elif manifest is not None and inner.data is not None:
        try:
            same = json.loads(inner.data) == manifest
        except (json.JSONDecodeError, UnicodeDecodeError):
            same = False
        if not same:
            problems.append(f"the tarball's {MANIFEST_FILE} differs from the uploaded one")

    for name, size, sha256 in _listed_files(manifest):
        member = members.get(name)
        if member is None:
            problems.append(f"{name}: listed in the manifest, missing from the tarball")
        elif size is not None and member.size != size:
            problems.append(f"{name}: {member.size} bytes in the tarball, manifest says {size}")
        elif sha256 is not None and member.sha256 != sha256.lower():
            problems.append(f"{name}: SHA-256 differs from the manifest")

    for name, path in sorted(loose.items()):
        member = members.get(name)
        if member is None:
            if name != MANIFEST_FILE:
                notes.append(f"{name}: uploaded, not in the tarball")
            continue
        if member.sha256 != sha256_file(path):
            problems.append(f"{name}: differs between the tarball and the uploaded file")
    not_uploaded = len(set(members) - set(loose))
    if not_uploaded:
        notes.append(f"{not_uploaded} files only in the tarball")
    return TarballCheck(shard, tarball_rel, len(members), tuple(problems), tuple(notes))


@dataclass(frozen=True, slots=True)
class _Member:
    size: int
    sha256: str
    data: bytes | None  # kept for the manifest only


def _read_members(path: Path) -> dict[str, _Member]:
    members: dict[str, _Member] = {}
    with tarfile.open(path, "r:*") as tar:
        for info in tar:
            if not info.isfile():
                continue
            name = info.name.removeprefix("./")
            handle = tar.extractfile(info)
            if handle is None:
                continue
            sha = hashlib.sha256()
            keep = PurePosixPath(name).name == MANIFEST_FILE
            kept = bytearray()
            while chunk := handle.read(_CHUNK):
                sha.update(chunk)
                if keep:
                    kept += chunk
            members[name] = _Member(info.size, sha.hexdigest(), bytes(kept) if keep else None)
    return members


def _strip_top(members: dict[str, _Member]) -> dict[str, _Member]:
    """Members relative to the shard folder, whether packed as `./x` or `<shard>/x`."""
    if MANIFEST_FILE in members or not members:
        return members
    tops = {name.split("/", 1)[0] for name in members}
    if len(tops) == 1 and all("/" in name for name in members):
        return {name.split("/", 1)[1]: member for name, member in members.items()}
    return members


def _listed_files(manifest: Any) -> list[tuple[str, int | None, str | None]]:
    """(path, size, sha256) of the files a manifest lists, if it lists any."""
    if not isinstance(manifest, dict):
        return []
    listed = manifest.get("files")
    entries: list[tuple[object, Any]] = []
    if isinstance(listed, dict):
        entries = list(listed.items())
    elif isinstance(listed, list):
        entries = [(e.get("path"), e) for e in listed if isinstance(e, dict)]
    found: list[tuple[str, int | None, str | None]] = []
    for name, entry in entries:
        if not isinstance(name, str):
            continue
        size = sha = None
        if isinstance(entry, dict):
            size = entry.get("size") if isinstance(entry.get("size"), int) else None
            sha = entry.get("sha256") if isinstance(entry.get("sha256"), str) else None
        elif isinstance(entry, str):
            sha = entry
        found.append((name.removeprefix("./"), size, sha))
    return found


