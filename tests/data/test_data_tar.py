"""Tar shards in the WebDataset layout (taskq.data.tar): members grouped by key, member
ranges from headers, start skipping, compressed shards, truncated members as DataError."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
from data_files import shard_samples, write_shard

from taskq import InvalidInput, data
from taskq.errors import DataError

TAR = data.reader("tar")


def test_members_are_grouped_into_samples_by_key(tmp_path: Path) -> None:
    samples = shard_samples(7)
    path = write_shard(tmp_path / "a.tar", samples)
    chunks = data.build_chunks(path)
    assert len(chunks) == 1
    assert chunks[0]["samples"] == 7 and chunks[0]["members"] == 7 * 2 + 3
    assert chunks[0]["format"] == "tar" and chunks[0]["offset"] == 0
    assert list(data.read_task(chunks)) == samples


def test_webdataset_keys_directories_and_extensions(tmp_path: Path) -> None:
    path = tmp_path / "k.tar"
    with tarfile.open(str(path), "w") as tf:
        for name, payload in (
            ("dir/a.b.seg.PNG", b"1"),
            ("dir/a.b.txt", b"2"),
            ("dir", None),
            ("README", b"no extension"),
            ("other/a.b.txt", b"3"),
        ):
            info = tarfile.TarInfo(name)
            if payload is None:
                info.type = tarfile.DIRTYPE
                tf.addfile(info)
                continue
            info.size = len(payload)
            tf.addfile(info, io.BytesIO(payload))
    assert list(data.read_task(data.build_chunks(str(path)))) == [
        {"__key__": "dir/a", "b.seg.png": b"1", "b.txt": b"2"},
        {"__key__": "other/a", "b.txt": b"3"},
    ]


@pytest.mark.parametrize("per_chunk", [1, 2, 5, 13, 100])
def test_member_ranges_hold_whole_samples_and_cover_the_shard(
    tmp_path: Path, per_chunk: int
) -> None:
    samples = shard_samples(13)
    path = write_shard(tmp_path / "a.tar", samples)
    chunks = data.build_chunks(path, records_per_chunk=per_chunk)
    assert len(chunks) == -(-13 // per_chunk)
    assert [c["samples"] for c in chunks[:-1]] == [per_chunk] * (len(chunks) - 1)
    with tarfile.open(path) as tf:  # every range starts at a sample's first header
        firsts = {m.offset for m in tf.getmembers() if m.name.endswith(".jpg")}
    assert all(c["offset"] in firsts for c in chunks)
    for prev, nxt in zip(chunks, chunks[1:], strict=False):
        assert nxt["offset"] == prev["offset"] + prev["length"]
    got = [list(TAR.read(c)) for c in chunks]
    assert [len(g) for g in got] == [c["samples"] for c in chunks]
    assert [s for g in got for s in g] == samples


@pytest.mark.parametrize("start", [0, 1, 4, 5, 6, 9, 10, 12])
def test_start_skips_samples_over_the_task(tmp_path: Path, start: int) -> None:
    samples = shard_samples(10)
    path = write_shard(tmp_path / "a.tar", samples)
    chunks = data.build_chunks(path, records_per_chunk=3)
    assert list(data.read_task(chunks, start=start)) == samples[start:]


def test_skipped_samples_data_is_never_read(tmp_path: Path) -> None:
    """The data of sample 0 is overwritten with garbage: starting past it still reads,
    since its members are passed over by their headers."""
    samples = shard_samples(4)
    path = write_shard(tmp_path / "a.tar", samples)
    with tarfile.open(path) as tf:
        first = tf.getmember("s00000.jpg")
    raw = bytearray(Path(path).read_bytes())
    raw[first.offset_data : first.offset_data + first.size] = b"\x00" * first.size
    Path(path).write_bytes(bytes(raw))
    chunk = data.build_chunks(path)[0]
    assert list(TAR.read(chunk, start=1)) == samples[1:]


def test_compressed_shard_is_streamed_whole(tmp_path: Path) -> None:
    samples = shard_samples(6)
    path = write_shard(tmp_path / "a.tar.gz", samples, gz=True)
    chunks = data.build_chunks(path)
    assert chunks == [
        {"format": "tar", "path": path, "compression": "gzip", "bytes": Path(path).stat().st_size}
    ]
    assert list(data.read_task(chunks)) == samples
    assert list(data.read_task(chunks, start=4)) == samples[4:]
    with pytest.raises(InvalidInput, match="compressed shard cannot be read by member range"):
        data.build_chunks(path, records_per_chunk=2)
    with pytest.raises(DataError, match="member range of a compressed file cannot be read"):
        list(TAR.read({"path": path, "offset": 512, "length": 1024}))


def test_truncated_member_is_a_data_error(tmp_path: Path) -> None:
    samples = shard_samples(5)
    path = write_shard(tmp_path / "a.tar", samples)
    chunks = data.build_chunks(path, records_per_chunk=2)
    with tarfile.open(path) as tf:
        cut_at = tf.getmember("s00003.jpg").offset_data + 5
    Path(path).write_bytes(Path(path).read_bytes()[:cut_at])
    assert list(TAR.read(chunks[0])) == samples[:2]  # the range before the cut reads
    with pytest.raises(DataError) as e:
        list(data.read_task(chunks))
    assert str(e.value).startswith(f"{path}: member s00003.jpg at byte ")
    assert "ReadError: unexpected end of data" in str(e.value)
    with pytest.raises(InvalidInput, match="s00003.jpg at byte .*truncated"):
        data.build_chunks(path)


def test_garbage_headers_are_data_errors_not_silent_ends(tmp_path: Path) -> None:
    """tarfile ends an archive quietly at a bad header past the first: the chunk's
    sample count turns that into a DataError."""
    samples = shard_samples(6)
    path = write_shard(tmp_path / "a.tar", samples)
    chunk = data.build_chunks(path)[0]
    with tarfile.open(path) as tf:
        third = tf.getmember("s00002.jpg").offset
    raw = bytearray(Path(path).read_bytes())
    raw[third : third + 512] = b"\x17" * 512
    Path(path).write_bytes(bytes(raw))
    with pytest.raises(DataError, match="2 samples, the chunk says 6"):
        list(TAR.read(chunk))
    with pytest.raises(InvalidInput, match=f"bad or truncated tar header at byte {third}"):
        data.build_chunks(path)
    Path(path).write_bytes(b"not a tar file at all" * 100)
    with pytest.raises(DataError, match="a.tar: header at byte 0: ReadError"):
        list(TAR.read(chunk))
    with pytest.raises(InvalidInput, match="a.tar: ReadError"):
        data.build_chunks(path)


def test_duplicate_extension_in_one_sample(tmp_path: Path) -> None:
    path = tmp_path / "d.tar"
    with tarfile.open(str(path), "w") as tf:
        for name in ("k.txt", "k.txt"):
            info = tarfile.TarInfo(name)
            info.size = 1
            tf.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(InvalidInput, match="duplicate extension 'txt' in sample 'k'"):
        data.build_chunks(str(path))
    with pytest.raises(DataError, match="duplicate extension 'txt' in sample 'k'"):
        list(TAR.read({"format": "tar", "path": str(path)}))
