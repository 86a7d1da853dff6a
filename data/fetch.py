#!/usr/bin/env python3
"""Download and verify the corpora listed in `data/corpora.tsv`.

    python3 data/fetch.py multi30k/train.en multi30k/train.de --dest DIR [--local DIR]

Each named file lands in DIR under its base name (`train.en`, `dev.tgz`, ...).
A file already there with the right sha256 is kept; with `--local DIR` (files you
fetched yourself, e.g. on a machine without internet) it is copied from there
instead of downloaded. Downloads resume from a `.part` file after an interruption,
and nothing reaches its final name before its checksum matches. Standard library
only, so recipes can call it before anything else is installed.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import hashlib
import os
import shutil
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

MANIFEST = Path(__file__).with_name("corpora.tsv")
CHUNK = 1 << 20


@dataclass(frozen=True)
class Corpus:
    name: str
    url: str
    sha256: str
    size: int
    unpack: str  # "gunzip": the checksum is of the decompressed file; "none": of the download

    @property
    def filename(self) -> str:
        return self.name.rsplit("/", 1)[-1]

    @property
    def download_name(self) -> str:
        return self.url.rsplit("/", 1)[-1]


class FetchError(Exception):
    pass


def read_manifest(path: Path) -> dict[str, Corpus]:
    with open(path, encoding="utf-8") as f:
        rows = csv.DictReader((line for line in f if not line.startswith("#")), delimiter="\t")
        return {
            row["name"]: Corpus(row["name"], row["url"], row["sha256"], int(row["bytes"]), row["unpack"])
            for row in rows
        }


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def is_complete(path: Path, corpus: Corpus) -> bool:
    return path.is_file() and path.stat().st_size == corpus.size and sha256_of(path) == corpus.sha256


def download(url: str, part: Path) -> None:
    """Fetch `url` into `part`, continuing where an earlier attempt stopped."""
    done = part.stat().st_size if part.exists() else 0
    request = urllib.request.Request(url, headers={"Range": f"bytes={done}-"} if done else {})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            # 206: the server honoured the range; 200: it sent everything again.
            mode = "ab" if done and response.status == 206 else "wb"
            with open(part, mode) as out:
                shutil.copyfileobj(response, out, CHUNK)
    except urllib.error.HTTPError as e:
        if e.code == 416 and done:  # range past the end: the download was already whole
            return
        raise FetchError(f"cannot download {url}: HTTP {e.code}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise FetchError(f"cannot download {url}: {reason}") from None


def unpack(source: Path, target: Path, how: str) -> None:
    if how == "gunzip":
        with gzip.open(source, "rb") as f, open(target, "wb") as out:
            shutil.copyfileobj(f, out, CHUNK)
    else:
        shutil.copyfile(source, target)


def fetch(corpus: Corpus, dest: Path, local: Path | None) -> Path:
    target = dest / corpus.filename
    if is_complete(target, corpus):
        print(f"ok      {target} (already verified)", file=sys.stderr)
        return target
    tmp = dest / f".{corpus.filename}.tmp"
    if local is not None:
        found = [p for p in (local / corpus.filename, local / corpus.download_name) if p.is_file()]
        if not found:
            raise FetchError(f"{corpus.name}: neither {corpus.filename} nor {corpus.download_name} is in {local}")
        source = found[0]
        unpack(source, tmp, corpus.unpack if source.name == corpus.download_name else "none")
    else:
        part = dest / f".{corpus.download_name}.part"
        print(f"fetch   {corpus.url}", file=sys.stderr)
        download(corpus.url, part)
        unpack(part, tmp, corpus.unpack)
        part.unlink()
    if not is_complete(tmp, corpus):
        tmp.unlink()
        raise FetchError(f"{corpus.name}: checksum mismatch (expected sha256 {corpus.sha256}, {corpus.size} bytes)")
    os.replace(tmp, target)
    print(f"ok      {target}", file=sys.stderr)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="+", help="corpus names from the manifest, e.g. multi30k/train.en")
    parser.add_argument("--dest", required=True, type=Path, help="directory to put the verified files in")
    parser.add_argument("--local", type=Path, help="take the files from this directory instead of downloading")
    parser.add_argument("--manifest", type=Path, default=MANIFEST, help="manifest to read (default: data/corpora.tsv)")
    args = parser.parse_args(argv)
    manifest = read_manifest(args.manifest)
    unknown = [n for n in args.names if n not in manifest]
    if unknown:
        print(f"error: unknown corpus {', '.join(unknown)} (see {args.manifest})", file=sys.stderr)
        return 2
    args.dest.mkdir(parents=True, exist_ok=True)
    try:
        for name in args.names:
            fetch(manifest[name], args.dest, args.local)
    except FetchError as e:
        hint = "" if args.local else " (offline? fetch the files elsewhere and pass their directory, e.g. DATA_DIR=... or WMT14_DIR=... for the recipes)"
        print(f"error: {e}{hint}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
