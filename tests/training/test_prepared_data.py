"""`data prepare`: a corpus tokenized into hashed shards and a canonical manifest, read back per
microbatch from (data set hash, microbatch id), resumed after an interruption, and refused with
a one-line error that names the bad file."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from gwtf.errors import ConfigError
from gwtf.node.training.dataset import ShardSampler, run_sampler, validation_batches
from gwtf.node.training.prepare import PrepareOptions, prepare
from gwtf.node.training.reference import whole_model_run
from gwtf.node.training.settings import TrainingSettings
from gwtf.node.training.shards import load_manifest
from gwtf.node.training.tokenizer import byte_tokenizer, load_tokenizer, train_tokenizer
from gwtf.node.training.window_map import epoch_key, permute, window_of_row

WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "seven",
    "wise",
    "owls",
    "sing",
    "softly",
]


def paragraphs(count: int, seed: int = 0) -> list[str]:
    """Distinct little documents (a fixed pseudo-random walk over WORDS)."""
    out = []
    for i in range(count):
        words = [WORDS[(i * 7 + k * (seed + 3)) % len(WORDS)] for k in range(8 + i % 13)]
        out.append(f"{i} " + " ".join(words) + ".\n")
    return out


def write_corpus(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    text = folder / "a.txt"
    text.write_text("\n".join(paragraphs(120)), encoding="utf-8")
    jsonl = folder / "b.jsonl"
    jsonl.write_text(
        "".join(json.dumps({"text": p, "id": i}) + "\n" for i, p in enumerate(paragraphs(80, 1)))
    )
    parquet = folder / "c.parquet"
    pq.write_table(pa.table({"text": paragraphs(60, 2), "n": list(range(60))}), parquet)
    return [text, jsonl, parquet]


def options(inputs: list[Path], out: Path, **extra: object) -> PrepareOptions:
    return replace(PrepareOptions(tuple(inputs), out, val_fraction=0.2, shard_tokens=2000), **extra)  # type: ignore[arg-type]


def test_text_jsonl_and_parquet_become_hashed_shards_and_a_canonical_manifest(
    tmp_path: Path,
) -> None:
    inputs = write_corpus(tmp_path / "corpus")
    done = prepare(options(inputs, tmp_path / "set"))
    manifest = load_manifest(tmp_path / "set")
    raw = (tmp_path / "set" / "manifest.json").read_bytes()
    assert manifest.digest == hashlib.sha256(raw).hexdigest() == done.manifest.digest
    assert (manifest.vocab_size, manifest.dtype, manifest.eod_id) == (256, "uint16", 0)
    assert manifest.tokenizer_kind == "bytes"
    assert manifest.tokenizer_sha256 == byte_tokenizer().sha256
    manifest.verify()
    # Every document comes back whole, followed by the end-of-document id, on one side only.
    streams = b""
    for shard in (*manifest.train, *manifest.val):
        data = (tmp_path / "set" / shard.file).read_bytes()
        assert hashlib.sha256(data).hexdigest() == shard.sha256
        assert len(data) == 2 * shard.tokens
        streams += bytes(np.frombuffer(data, dtype="<u2").astype(np.uint8))
    documents = [d for d in streams.decode().split("\x00") if d]
    expected = paragraphs(120) + paragraphs(80, 1) + paragraphs(60, 2)
    assert sorted(documents) == sorted(expected)
    assert manifest.val and manifest.train
    assert 0.05 < manifest.val_tokens / (manifest.train_tokens + manifest.val_tokens) < 0.4


def test_a_sponsor_tokenizer_sets_the_vocabulary_and_its_hash_is_in_the_manifest(
    tmp_path: Path,
) -> None:
    inputs = write_corpus(tmp_path / "corpus")
    trained = train_tokenizer(paragraphs(200), 300)
    file = tmp_path / "tokenizer.json"
    file.write_text(trained.json_text, encoding="utf-8")
    manifest = prepare(options(inputs, tmp_path / "set", tokenizer=file)).manifest
    assert manifest.vocab_size == 300
    assert manifest.tokenizer_sha256 == hashlib.sha256(file.read_bytes()).hexdigest()
    assert manifest.tokenizer_kind == "file"
    tokenizer = load_tokenizer(tmp_path / "set" / "tokenizer.json")
    first = manifest.read(manifest.train[0], 0, manifest.train[0].tokens)
    end = int(np.flatnonzero(first == tokenizer.eod_id)[0])
    assert tokenizer.decode(first[:end].tolist()) == "0 " + paragraphs(1)[0][2:]


def test_a_tokenizer_trained_by_prepare_is_deterministic(tmp_path: Path) -> None:
    inputs = write_corpus(tmp_path / "corpus")
    one = prepare(options(inputs, tmp_path / "one", train_vocab=320)).manifest
    two = prepare(options(inputs, tmp_path / "two", train_vocab=320)).manifest
    assert one.tokenizer_kind == "trained" and one.vocab_size == 320
    assert one.digest == two.digest
    assert (tmp_path / "one" / "tokenizer.json").read_bytes() == (
        tmp_path / "two" / "tokenizer.json"
    ).read_bytes()


def test_token_files_of_a_large_vocabulary_are_stored_as_uint32(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models

    vocab = {f"w{i}": i for i in range(70_000)}
    vocab["<|endoftext|>"] = 70_000
    file = tmp_path / "tokenizer.json"
    file.write_text(Tokenizer(models.WordLevel(vocab, unk_token="w0")).to_str())
    ids = (np.arange(5000, dtype=np.uint32) * 13) % 70_001
    np.save(tmp_path / "tokens.npy", ids)
    manifest = prepare(
        options([tmp_path / "tokens.npy"], tmp_path / "set", tokenizer=file, val_fraction=0.1)
    ).manifest
    assert (manifest.dtype, manifest.vocab_size) == ("uint32", 70_001)
    assert manifest.val_tokens == 500 and manifest.train_tokens == 4500
    back = np.concatenate([manifest.read(s, 0, s.tokens) for s in (*manifest.train, *manifest.val)])
    assert np.array_equal(back, ids.astype(np.int64))


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("missing", "corpus file {d}/nope.txt does not exist"),
        ("field", "{d}/b.jsonl:1: no text field 'body'"),
        ("column", "{d}/c.parquet: no text column 'body'"),
        ("widths", "token file {d}/wide.npy holds uint32 ids but {d}/narrow.npy holds uint16"),
        ("raw width", "token file {d}/odd.bin is 3 bytes"),
        ("outside", "token file {d}/narrow.npy holds id 300, outside the tokenizer's vocab"),
    ],
)
def test_a_bad_corpus_is_refused_with_a_message_naming_the_file(
    tmp_path: Path, case: str, message: str
) -> None:
    d = tmp_path / "corpus"
    write_corpus(d)
    np.save(d / "narrow.npy", np.array([1, 2, 300], dtype=np.uint16))
    np.save(d / "wide.npy", np.array([1, 2, 3], dtype=np.uint32))
    (d / "odd.bin").write_bytes(b"abc")
    inputs = {
        "missing": [d / "nope.txt"],
        "field": [d / "b.jsonl"],
        "column": [d / "c.parquet"],
        "widths": [d / "narrow.npy", d / "wide.npy"],
        "raw width": [d / "odd.bin"],
        "outside": [d / "narrow.npy"],
    }[case]
    field = "body" if case in ("field", "column") else "text"
    with pytest.raises(ConfigError, match=None) as caught:
        prepare(options(inputs, tmp_path / "set", field=field))
    assert message.format(d=d) in str(caught.value)
    assert "\n" not in str(caught.value)


def test_an_interrupted_prepare_resumes_and_a_damaged_shard_is_written_again(
    tmp_path: Path,
) -> None:
    inputs = write_corpus(tmp_path / "corpus")
    out = tmp_path / "set"
    sizes = [p.stat().st_size for p in inputs]
    seen = 0

    def interrupt_in_the_second_file(n: int) -> None:
        nonlocal seen
        seen += n
        if seen > sizes[0]:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        prepare(options(inputs, out), interrupt_in_the_second_file)
    assert not (out / "manifest.json").exists()
    resumed = prepare(options(inputs, out))
    assert (resumed.files_reused, resumed.files_read) == (1, 2)
    whole = prepare(options(inputs, tmp_path / "whole")).manifest
    assert resumed.manifest.digest == whole.digest
    # A shard that no longer matches its hash is prepared again, never trusted.
    shard = out / resumed.manifest.train[0].file
    shard.write_bytes(b"\x00\x00" + shard.read_bytes()[2:])
    with pytest.raises(ConfigError, match=f"shard {shard} does not match its hash"):
        load_manifest(out).verify()
    with pytest.raises(ConfigError, match=f"shard {shard} does not match its hash"):
        run_sampler(str(out), 2, 16, 0)
    again = prepare(options(inputs, out))
    assert (again.files_reused, again.files_read) == (2, 1)
    assert again.manifest.digest == whole.digest
    load_manifest(out).verify()


def test_a_manifest_edited_by_hand_is_refused(tmp_path: Path) -> None:
    inputs = write_corpus(tmp_path / "corpus")
    prepare(options(inputs, tmp_path / "set"))
    path = tmp_path / "set" / "manifest.json"
    path.write_text(json.dumps(json.loads(path.read_text()), indent=1))
    with pytest.raises(ConfigError, match=f"data set manifest {path} is not in canonical form"):
        load_manifest(path)


@pytest.mark.parametrize("count", [*range(1, 40), 1000, 4097])
def test_the_window_map_is_a_permutation(count: int) -> None:
    key = epoch_key("ab" * 32, 7, 0)
    assert sorted(permute(i, count, key) for i in range(count)) == list(range(count))


def test_the_window_map_gives_the_same_windows_in_every_version() -> None:
    """Fixed outputs: nodes of different versions must read the same windows for an id, so a
    change here is a change of protocol, never a refactoring."""
    digest = "ab" * 32
    assert epoch_key(digest, 7, 0).hex() == (
        "409a3d3a098b7748b53794ba90a3870416e46bd1fb914679596645beb609862b"
    )
    rows = [window_of_row(r, 1000, digest, 7) for r in (0, 1, 2, 999, 1000, 12345)]
    assert rows == [(0, 73), (0, 646), (0, 143), (0, 948), (1, 982), (12, 973)]
    key = epoch_key(digest, 0, 0)
    assert [permute(i, 10, key) for i in range(10)] == [8, 2, 1, 7, 9, 5, 6, 0, 4, 3]


def test_microbatches_come_from_the_data_set_hash_and_id_alone(tmp_path: Path) -> None:
    inputs = write_corpus(tmp_path / "corpus")
    manifest = prepare(options(inputs, tmp_path / "set")).manifest
    a = ShardSampler(load_manifest(tmp_path / "set"), 3, 16, seed=5)
    b = ShardSampler(
        load_manifest(tmp_path / "set"), 3, 16, seed=5, expected_digest=manifest.digest
    )
    for m in (0, 1, 17, 10_000):
        assert all(torch.equal(x, y) for x, y in zip(a(m), b(m), strict=True))
    inputs_, targets = a(3)
    assert inputs_.shape == targets.shape == (3, 16) and inputs_.dtype == torch.int64
    assert torch.equal(inputs_[:, 1:], targets[:, :-1])
    # Each epoch reads every window once, in an order of its own and of the run's seed.
    one = ShardSampler(manifest, 1, 16, seed=5)
    first_epoch = [one.window(r) for r in range(one.windows)]
    assert len(set(first_epoch)) == one.windows
    second_epoch = [one.window(r) for r in range(one.windows, 2 * one.windows)]
    assert set(second_epoch) == set(first_epoch) and second_epoch != first_epoch
    other_seed = ShardSampler(manifest, 1, 16, seed=6)
    assert [other_seed.window(r) for r in range(one.windows)] != first_epoch
    start = one.window(0)
    assert torch.equal(one(0)[0][0], torch.from_numpy(one.stream.read(start, 16)))
    with pytest.raises(ConfigError, match="not the run's data set hash"):
        ShardSampler(manifest, 1, 16, expected_digest="00" * 32)


def test_validation_windows_are_fixed_and_the_reference_reports_their_loss(
    tmp_path: Path,
) -> None:
    inputs = write_corpus(tmp_path / "corpus")
    manifest = prepare(options(inputs, tmp_path / "set", train_vocab=300)).manifest
    batches = validation_batches(manifest, 2, 16, 5)
    assert [len(x) for x, _ in batches] == [2, 2, 1]
    again = validation_batches(load_manifest(tmp_path / "set"), 2, 16, 5)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(batches, again, strict=True))
    torch.manual_seed(0)
    training = TrainingSettings(
        data=str(tmp_path / "set"),
        seq_len=16,
        device="cpu",
        validation_every=2,
        validation_windows=4,
        microbatches_per_iteration=2,
    )
    training.validate()
    run = whole_model_run(training, 4)
    assert len(run.losses) == 4
    assert [i for i, _ in run.validation] == [1, 3]
    assert all(2.0 < loss < 7.0 for _, loss in run.validation)  # about ln(300) = 5.7 at first


def test_many_small_files_lose_no_windows(tmp_path: Path) -> None:
    """Two hundred files of ~1,250 tokens each: the split is one stream, so at seq_len 1024 at
    most one window's tokens go unread, in training and in validation alike."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(200):
        (corpus / f"{i:03d}.txt").write_text(" ".join(paragraphs(60, seed=i))[:1250])
    out = tmp_path / "set"
    manifest = prepare(
        PrepareOptions((corpus,), out, doc_split="file", val_fraction=0.1, shard_tokens=10**6)
    ).manifest
    assert len(manifest.train) + len(manifest.val) == 200  # a shard per file
    sampler = ShardSampler(manifest, 2, 1024)
    assert sampler.windows == (manifest.train_tokens - 1) // 1024
    assert sampler.stream.unused(1024) <= 1024
    assert sampler.windows * 1024 > 0.99 * manifest.train_tokens - 1024
    # Every window reads across files where it must: its tokens are the stream's.
    stream = np.concatenate([manifest.read(s, 0, s.tokens) for s in manifest.train])
    inputs, targets = sampler(5)
    for row in range(2):
        start = sampler.window(5 * 2 + row)
        assert torch.equal(inputs[row], torch.from_numpy(stream[start : start + 1024]))
        assert torch.equal(targets[row], torch.from_numpy(stream[start + 1 : start + 1025]))
    batches = validation_batches(manifest, 4, 1024, 10**6)
    assert sum(len(x) for x, _ in batches) == (manifest.val_tokens - 1) // 1024 > 10


def test_an_out_folder_inside_the_corpus_is_no_input(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    inputs = write_corpus(corpus)
    first = prepare(options([corpus], corpus / "set"))
    assert first.files_read == len(inputs)
    # Resumed, the shards written beside the corpus (.bin files) are not read as tokens.
    again = prepare(options([corpus], corpus / "set"))
    assert (again.files_reused, again.files_read) == (len(inputs), 0)
    assert again.manifest.digest == first.manifest.digest
    with pytest.raises(ConfigError, match="lies inside --out"):
        prepare(options([corpus / "set"], corpus))


def test_a_damaged_tokenizer_record_is_trained_again(tmp_path: Path) -> None:
    inputs = write_corpus(tmp_path / "corpus")
    manifest = prepare(options(inputs, tmp_path / "set", train_vocab=300)).manifest
    record = tmp_path / "set" / ".prepare" / "tokenizer.json"
    for damage in ('{"key": 1}', "{", json.dumps({**json.loads(record.read_text()), "json": "x"})):
        record.write_text(damage)
        again = prepare(options(inputs, tmp_path / "set", train_vocab=300)).manifest
        assert again.digest == manifest.digest


def test_the_vocabulary_is_the_highest_id_plus_one(tmp_path: Path) -> None:
    """A tokenizer whose ids skip some: the model's vocabulary must hold its highest id."""
    vocab = {"a": 0, "b": 1, "<|endoftext|>": 70_000}
    text = json.dumps(
        {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": [],
            "normalizer": None,
            "pre_tokenizer": None,
            "post_processor": None,
            "decoder": None,
            "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "a"},
        }
    )
    (tmp_path / "tokenizer.json").write_text(text)
    tokenizer = load_tokenizer(tmp_path / "tokenizer.json")
    assert tokenizer.vocab_size == 70_001
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "t.txt").write_text("a b a\n\nb b\n")
    manifest = prepare(
        PrepareOptions(
            (tmp_path / "c",),
            tmp_path / "set",
            tokenizer=tmp_path / "tokenizer.json",
            val_fraction=0,
        )
    ).manifest
    assert (manifest.vocab_size, manifest.dtype, manifest.eod_id) == (70_001, "uint32", 70_000)
