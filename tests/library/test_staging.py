"""keras_vit.staging: a staging folder left by a process killed with SIGKILL is removed by the next run that stages
in the same folder under the same prefix; a live process's folder, or anything else, is kept (issue 36)."""

import json
import os
import shutil

import pytest
from staging_support import killed_staging

from keras_vit import staging
from keras_vit.staging import OWNER, new_staging, remove_stale, staging_folder

pytestmark = pytest.mark.backend_independent  # files and processes: the same on every backend


def copy_with_record(source, destination, **changes):
    """A copy of the staging folder ``source`` at ``destination``, its owner record changed by ``changes``."""
    shutil.copytree(source, destination)
    record = json.loads((source / OWNER).read_text())
    (destination / OWNER).write_text(json.dumps({**record, **changes}))
    return destination


def test_a_killed_processs_staging_folder_is_removed_by_the_next_run(tmp_path):
    out = tmp_path / "out"
    left = killed_staging(out, ".export-")
    assert left.name.startswith(".export-") and (left / "half-written").stat().st_size == 1000
    record = json.loads((left / OWNER).read_text())
    assert record["pid"] != os.getpid() and record["host"]
    (out / "model.tflite").write_bytes(b"the user's")
    with staging_folder(out, ".export-") as mine:
        assert not left.exists()  # the killed run's, with what it had half written
        assert json.loads((mine / OWNER).read_text())["pid"] == os.getpid()
        assert sorted(os.listdir(out)) == sorted([mine.name, "model.tflite"])
    assert os.listdir(out) == ["model.tflite"]


def test_a_live_processs_staging_folder_is_kept_and_a_reused_process_id_is_not_its_owner(tmp_path):
    live = new_staging(tmp_path, ".export-")  # this process's: it lives
    with staging_folder(tmp_path, ".export-") as mine:
        assert live.is_dir() and mine.is_dir()
    assert remove_stale(tmp_path, ".export-") == [] and live.is_dir()
    if staging._start_time(os.getpid()) is None:
        pytest.skip("no process start times here (/proc): a reused process id keeps its folder")
    reused = copy_with_record(live, tmp_path / ".export-0123456789ab.tmp", started="1")  # our id, another start
    assert remove_stale(tmp_path, ".export-") == [str(reused)] and live.is_dir()


def test_only_a_folder_of_the_name_and_a_record_of_a_process_gone_from_this_host_is_removed(tmp_path):
    """Lookalikes of a killed run's folder, each kept: no record, a damaged or linked record, another host or PID
    namespace, another prefix (another command's), a name that is not a staging name, a link to such a folder."""
    out = tmp_path / "out"
    dead = killed_staging(tmp_path / "elsewhere", ".export-")
    unmarked = out / ".export-00000000000a.tmp"
    (unmarked / "data").parent.mkdir(parents=True)
    (unmarked / "data").write_bytes(b"the user's")
    damaged = copy_with_record(dead, out / ".export-00000000000b.tmp")
    (damaged / OWNER).write_text('{"pid": ')
    linked = copy_with_record(dead, out / ".export-00000000000c.tmp")
    (linked / OWNER).unlink()
    (linked / OWNER).symlink_to(dead / OWNER)
    kept = [
        unmarked,
        damaged,
        linked,
        copy_with_record(dead, out / ".export-00000000000d.tmp", host="another-host"),
        copy_with_record(dead, out / ".export-000000000010.tmp", pids="pid:[1]"),  # a container's: its ids are not ours
        copy_with_record(dead, out / ".analysis-00000000000e.tmp"),
        copy_with_record(dead, out / ".export-backup.tmp"),
        copy_with_record(dead, out / "export-00000000000f.tmp"),
    ]
    (out / ".export-0000000000aa.tmp").symlink_to(dead)
    assert remove_stale(out, ".export-") == []
    assert all(path.is_dir() for path in kept) and (unmarked / "data").read_bytes() == b"the user's"
    assert (out / ".export-0000000000aa.tmp").is_symlink() and dead.is_dir()
    assert remove_stale(dead.parent, ".export-") == [str(dead)]  # the original, where it was left


def test_a_folder_that_cannot_hold_a_staging_folder_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"No such folder to write into: '{tmp_path / 'missing'}'"):
        new_staging(tmp_path / "missing", ".export-")
    assert remove_stale(tmp_path / "missing", ".export-") == []
