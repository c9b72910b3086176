"""The cache's records and its files (``keras_vit.zoo.cache``): a changed or hand-placed file, a damaged record,
links where the cache writes; against a local server (``serving.py``)."""

import hashlib
import re

import pytest
from npz_layout import TI_16, vit_checkpoint, write_checkpoint

import keras_vit
from keras_vit import zoo
from keras_vit.zoo.__main__ import main as zoo_main
from keras_vit.zoo.cache import record_path, recorded
from keras_vit.zoo.download import CorruptCheckpointError, DownloadError

from .serving import cache_listing, fetch_file

pytestmark = pytest.mark.backends("tensorflow")  # the default backend only: backend-independent or slow


def test_fetch_of_a_corrupted_cached_file_names_it_and_keeps_it(tmp_path, payload, serve, monkeypatch):
    entry = zoo.get("Ti_16.augreg_in21k")
    server = serve({"/" + entry.path: payload})
    monkeypatch.setenv(zoo.MIRROR_ENV, server.url)
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    path = zoo.fetch(entry)
    broken = bytearray(payload)
    broken[len(broken) // 2] ^= 0xFF
    path.write_bytes(bytes(broken))
    with pytest.raises(
        CorruptCheckpointError,
        match=f"The cached file {re.escape(str(path))} is corrupt .*recorded when it was downloaded.*Delete it",
    ):
        zoo.fetch(entry, tmp_path)
    assert path.read_bytes() == bytes(broken) and len(server.requests) == 1  # kept, not downloaded again
    with pytest.raises(CorruptCheckpointError):
        keras_vit.ViT_Ti16(weights="Ti_16.augreg_in21k", hidden_size=32, depth=1, num_heads=2, mlp_dim=64)


def test_a_damaged_sha256_record_is_named_and_rewritten_not_blamed_on_the_checkpoint(
    tmp_path, serve, monkeypatch, capsys
):

    entry = zoo.get("Ti_16.augreg_in21k")
    payload = write_checkpoint(tmp_path / "ti16.npz", vit_checkpoint(**TI_16, num_classes=21843)).read_bytes()
    server = serve({"/" + entry.path: payload})
    monkeypatch.setenv(zoo.MIRROR_ENV, server.url)
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    path = zoo.fetch(entry)
    record_path(path).write_text("not a sha256 at all\n")  # the record damaged, the checkpoint whole
    zoo_main(["verify", entry.name])  # exit 0: nothing is corrupt
    out = capsys.readouterr().out
    assert re.search(
        rf"^unrecorded +{entry.name}: .*its record .*\.sha256 is damaged \(not a sha256 line\), structure OK", out, re.M
    )
    assert "0 corrupt" in out and "elete" not in out
    assert zoo.fetch(entry) == path and recorded(path) == hashlib.sha256(payload).hexdigest()  # checked, rewritten
    assert path.read_bytes() == payload and len(server.requests) == 1


def test_a_file_put_in_the_cache_by_hand_is_checked_then_recorded(tmp_path, payload, serve):
    server = serve({})
    dest = tmp_path / "cache" / "a.npz"
    dest.parent.mkdir()
    dest.write_bytes(payload[:-10])
    with pytest.raises(CorruptCheckpointError, match=r"not a valid \.npz checkpoint"):
        fetch_file(server, tmp_path)
    assert dest.read_bytes() == payload[:-10] and not record_path(dest).exists()  # the user's file: kept
    dest.write_bytes(payload)
    assert fetch_file(server, tmp_path) == dest and recorded(dest) == hashlib.sha256(payload).hexdigest()
    assert server.requests == []


def _user_file_linked_from_cache(tmp_path, name: str):
    """A user's file outside the cache, and the cache's ``name`` a symbolic link to it."""
    notes = tmp_path / "notes.txt"
    notes.write_bytes(b"my own notes\n")
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / name).symlink_to(notes)
    return notes


@pytest.mark.backend_independent
def test_a_partial_file_that_is_a_link_is_replaced_never_written_through(tmp_path, payload, serve):
    server = serve({"/a.npz": payload})
    notes = _user_file_linked_from_cache(tmp_path, "a.npz.part")
    path = fetch_file(server, tmp_path)
    assert notes.read_bytes() == b"my own notes\n"  # the link's target is untouched
    assert not path.is_symlink() and path.is_file() and path.read_bytes() == payload
    assert cache_listing(tmp_path) == ["a.npz", "a.npz.sha256"]


@pytest.mark.backend_independent
def test_a_lock_file_that_is_a_link_is_refused_naming_the_cache(tmp_path, payload, serve):
    server = serve({"/a.npz": payload})
    notes = _user_file_linked_from_cache(tmp_path, "a.npz.lock")
    with pytest.raises(DownloadError, match=r"Cannot write to the cache folder .*cache") as failed:
        fetch_file(server, tmp_path)
    assert "\n" not in str(failed.value) and server.requests == []
    assert notes.read_bytes() == b"my own notes\n" and not (tmp_path / "cache" / "a.npz").exists()


@pytest.mark.backend_independent
def test_a_record_that_is_a_link_is_replaced_never_written_through(tmp_path, payload, serve):
    server = serve({"/a.npz": payload})
    notes = _user_file_linked_from_cache(tmp_path, "a.npz.sha256")
    path = fetch_file(server, tmp_path)
    assert notes.read_bytes() == b"my own notes\n" and len(server.requests) == 1
    record = record_path(path)
    assert not record.is_symlink() and recorded(path) == hashlib.sha256(payload).hexdigest()
    assert cache_listing(tmp_path) == ["a.npz", "a.npz.sha256"]


@pytest.mark.backend_independent
def test_a_cached_name_that_links_to_a_users_file_is_checked_not_downloaded_over(tmp_path, payload, serve):
    """The link is read as a file put in the cache by hand: not a checkpoint, so it is named and kept, its target
    untouched, nothing downloaded and nothing recorded."""
    server = serve({"/a.npz": payload})
    notes = _user_file_linked_from_cache(tmp_path, "a.npz")
    with pytest.raises(CorruptCheckpointError, match=r"a\.npz is not a valid \.npz checkpoint"):
        fetch_file(server, tmp_path)
    assert notes.read_bytes() == b"my own notes\n" and server.requests == []
    assert (tmp_path / "cache" / "a.npz").is_symlink() and cache_listing(tmp_path) == ["a.npz"]
