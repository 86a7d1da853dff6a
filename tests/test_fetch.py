"""data/fetch.py: verified, resumable downloads from a local HTTP server."""

from __future__ import annotations

import gzip
import hashlib
import http.server
import importlib.util
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("fetch", ROOT / "data" / "fetch.py")
fetch = importlib.util.module_from_spec(spec)
sys.modules["fetch"] = fetch  # dataclasses look their module up there
spec.loader.exec_module(fetch)


class RangeHandler(http.server.SimpleHTTPRequestHandler):
    """Serves files and honours `Range: bytes=N-` (the standard handler does not)."""

    def do_GET(self):  # noqa: N802 (http.server's naming)
        path = Path(self.translate_path(self.path))
        if not path.is_file():
            self.send_error(404)
            return
        data = path.read_bytes()
        start = 0
        if (header := self.headers.get("Range")) and header.startswith("bytes="):
            start = int(header[6:].split("-")[0])
            self.send_response(206)
        else:
            self.send_response(200)
        body = data[start:]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def server(tmp_path):
    root = tmp_path / "www"
    root.mkdir()
    handler = lambda *a: RangeHandler(*a, directory=str(root))  # noqa: E731
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def write_manifest(path: Path, rows: list[tuple[str, str, bytes, str]]) -> Path:
    lines = ["name\turl\tsha256\tbytes\tunpack\tterms\tcitation"]
    for name, url, content, unpack in rows:
        lines.append(f"{name}\t{url}\t{hashlib.sha256(content).hexdigest()}\t{len(content)}\t{unpack}\tt\tc")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_download_verifies_unpacks_and_resumes(server, tmp_path):
    root, url = server
    text = b"ein Satz\n" * 1000
    (root / "a.gz").write_bytes(gzip.compress(text))
    archive = bytes(range(256)) * 64
    (root / "b.tgz").write_bytes(archive)
    manifest = write_manifest(
        tmp_path / "m.tsv", [("x/a.txt", f"{url}/a.gz", text, "gunzip"), ("x/b.tgz", f"{url}/b.tgz", archive, "none")]
    )
    dest = tmp_path / "dest"
    dest.mkdir()
    # An interrupted earlier download: the first half is already there.
    (dest / ".b.tgz.part").write_bytes(archive[: len(archive) // 2])
    assert fetch.main(["x/a.txt", "x/b.tgz", "--dest", str(dest), "--manifest", str(manifest)]) == 0
    assert (dest / "a.txt").read_bytes() == text
    assert (dest / "b.tgz").read_bytes() == archive
    assert not list(dest.glob(".*"))
    # A second run verifies and keeps the files.
    assert fetch.main(["x/a.txt", "--dest", str(dest), "--manifest", str(manifest)]) == 0


def test_checksum_mismatch_leaves_nothing(server, tmp_path, capsys):
    root, url = server
    (root / "c.tgz").write_bytes(b"tampered")
    manifest = write_manifest(tmp_path / "m.tsv", [("x/c.tgz", f"{url}/c.tgz", b"original", "none")])
    dest = tmp_path / "dest"
    assert fetch.main(["x/c.tgz", "--dest", str(dest), "--manifest", str(manifest)]) == 1
    assert "checksum mismatch" in capsys.readouterr().err
    assert not (dest / "c.tgz").exists()


def test_offline_error_says_how_to_use_local_files(tmp_path, capsys):
    manifest = write_manifest(tmp_path / "m.tsv", [("x/d.txt", "http://127.0.0.1:9/d.txt", b"d", "none")])
    assert fetch.main(["x/d.txt", "--dest", str(tmp_path / "dest"), "--manifest", str(manifest)]) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "cannot download" in errors[0] and "DATA_DIR" in errors[0]


def test_local_directory_instead_of_download(tmp_path):
    text = b"local line\n"
    local = tmp_path / "local"
    local.mkdir()
    (local / "e.gz").write_bytes(gzip.compress(text))
    manifest = write_manifest(tmp_path / "m.tsv", [("x/e.txt", "http://127.0.0.1:9/e.gz", text, "gunzip")])
    dest = tmp_path / "dest"
    assert fetch.main(["x/e.txt", "--dest", str(dest), "--local", str(local), "--manifest", str(manifest)]) == 0
    assert (dest / "e.txt").read_bytes() == text


def test_manifest_lists_every_recipe_corpus_with_checksums():
    corpora = fetch.read_manifest(fetch.MANIFEST)
    for split in ("train", "valid", "test"):
        for lang in ("en", "de"):
            assert f"multi30k/{split}.{lang}" in corpora
    for corpus in corpora.values():
        assert len(corpus.sha256) == 64 and corpus.size > 0 and corpus.unpack in ("gunzip", "none")


def load_recipe_module(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "recipes" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_manifest_lists_every_wmt14_archive_the_recipe_fetches():
    plan = load_recipe_module("wmt14_plan")
    corpora = fetch.read_manifest(fetch.MANIFEST)
    for pair in ("en-de", "en-fr"):
        for name in plan.archives(pair):
            assert name in corpora and corpora[name].unpack == "none"


@pytest.mark.parametrize("pair", ["en-de", "en-fr"])
def test_generated_wmt14_archives_verify_and_a_truncated_one_is_refused(tmp_path, capsys, pair):
    """The SMOKE archives pass fetch's checks from a local directory; one cut short does not,
    and leaves nothing at its final name."""
    plan = load_recipe_module("wmt14_plan")
    smoke_data = load_recipe_module("wmt14_smoke_data")
    local = tmp_path / "local"
    manifest = smoke_data.write(pair, local, 60)
    names = plan.archives(pair)
    dest = tmp_path / "dest"
    assert fetch.main([*names, "--dest", str(dest), "--local", str(local), "--manifest", str(manifest)]) == 0
    assert sorted(p.name for p in dest.iterdir()) == sorted(n.rsplit("/", 1)[-1] for n in names)
    # Same arguments, same bytes: the manifest's checksums hold from one run to the next.
    assert smoke_data.write(pair, tmp_path / "again", 60).read_text() == manifest.read_text()

    archive = local / "dev.tgz"
    archive.write_bytes(archive.read_bytes()[:-10])
    fresh = tmp_path / "fresh"
    assert fetch.main(["wmt/dev.tgz", "--dest", str(fresh), "--local", str(local), "--manifest", str(manifest)]) == 1
    assert "checksum mismatch" in capsys.readouterr().err
    assert not (fresh / "dev.tgz").exists() and not list(fresh.glob(".*"))
