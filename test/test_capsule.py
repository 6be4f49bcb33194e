"""Execution-state capsules of the reference pipeline: byte-exact restore, independent forks,
clear errors for unknown names."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from flashrt_ros.engine.capsule import CapsuleNotFound, CapsuleStore, CapsuleStoreFull, PipelineState
from flashrt_ros.engine.pipeline import Pipeline
from flashrt_ros.policies.policy import Observation, default_policy

SEED = 3


@pytest.fixture(scope="module")
def policy():
    return default_policy(num_views=2, action_dof=6, seed=0)


@pytest.fixture
def state(policy) -> PipelineState:
    return PipelineState(Pipeline(policy, seed=SEED), SEED)


@pytest.fixture
def store(state) -> CapsuleStore:
    ticks = iter(range(1_000, 10**9, 1_000))
    return CapsuleStore(state, clock_ns=lambda: next(ticks))


def observation(i: int) -> Observation:
    rng = np.random.default_rng(i)
    images = [rng.integers(0, 256, (24, 32, 3), dtype=np.uint8) for _ in range(2)]
    return Observation(images, rng.normal(size=6).astype(np.float32) * 0.3, "pick up the cube")


def run(state: PipelineState, steps: range) -> list[tuple[int, bytes]]:
    """(chunk id, action bytes) of one decision per observation index."""
    out = []
    for i in steps:
        decision = state.decide(observation(i))
        out.append((decision.chunk_id, decision.actions.tobytes()))
    return out


def test_restore_gives_byte_identical_next_decisions(state, store):
    run(state, range(2))
    store.snapshot("after_two")
    original = run(state, range(2, 5))
    run(state, range(5, 7))  # move on, so restoring has something to undo
    restored = store.restore("after_two")
    assert restored.name == "after_two"
    live = state.read()  # every buffer back, the last chunk too
    assert {k: v.tobytes() for k, v in live.items()} == {k: v.tobytes() for k, v in restored.buffers.items()}
    assert run(state, range(2, 5)) == original  # same ids, same bytes


def test_snapshot_holds_rng_counter_and_last_chunk(state, store):
    ((cid, actions),) = run(state, range(1))
    capsule = store.snapshot("one")
    assert set(capsule.buffers) == {"rng", "next_chunk_id", "last_actions"}
    assert capsule.buffers["next_chunk_id"].tolist() == [cid + 1]
    assert capsule.buffers["last_actions"].tobytes() == actions
    assert capsule.buffers["rng"].dtype == np.uint8 and capsule.buffers["rng"].size > 0
    horizon = state.pipeline.policy.cfg.horizon  # uint8 generator state + one int64 + horizon x 6 float32
    assert (
        capsule.size_bytes
        == capsule.buffers["rng"].size + 8 + horizon * 6 * 4
        == capsule.buffers["rng"].size + 8 + len(actions)
    )
    with pytest.raises(ValueError, match="read-only"):  # capsules are immutable
        capsule.buffers["last_actions"][0, 0] = 1.0


def test_fork_is_independent(state, store):
    run(state, range(1))
    store.snapshot("base")
    expected = run(state, range(1, 3))
    store.fork("base", "copy")
    run(state, range(3, 4))
    store.snapshot("base")  # replaces base with a later state ...
    store.drop("base")  # ... then drops it: the fork must not care
    store.restore("copy")
    assert run(state, range(1, 3)) == expected
    with pytest.raises(ValueError, match="already exists"):
        store.fork("copy", "copy")
    with pytest.raises(ValueError, match=r"^fork target \(the new capsule's name\) must be a non-empty string"):
        store.fork("copy", "")  # which of the two names is wrong


def test_list_sorted_with_sizes_and_stamps(state, store):
    store.snapshot("b")
    store.snapshot("a")
    listing = store.list()
    assert [c.name for c in listing] == ["a", "b"]
    assert all(c.size_bytes > 0 for c in listing)
    assert listing[0].created_ns > listing[1].created_ns  # a was taken after b


@pytest.mark.parametrize("operation", ["restore", "drop", "fork"])
def test_unknown_names_raise_key_error_with_message(store, operation):
    store.snapshot("warm")
    call = {
        "restore": lambda: store.restore("nope"),
        "drop": lambda: store.drop("nope"),
        "fork": lambda: store.fork("nope", "x"),
    }[operation]
    with pytest.raises(KeyError) as err:
        call()
    assert isinstance(err.value, CapsuleNotFound)
    assert str(err.value) == "no capsule named 'nope' (have: 'warm')"


def test_an_unknown_name_in_an_empty_store_says_none_are_kept(store):
    with pytest.raises(CapsuleNotFound) as err:
        store.restore("x")
    assert str(err.value) == "no capsule named 'x' (have: none)"


def test_invalid_name_refused(store):
    with pytest.raises(ValueError, match="non-empty"):
        store.snapshot("  ")
    # names that read alike in a list were different capsules
    # blanks that are no control character: a grapheme joiner, a variation selector, Hangul fillers, Braille blank
    blanks = ("grasp\u034f", "a\ufe0f", "\u3164", "a\u115f", "\u2800", "a\U000e0100", "a\u17b4b", "a\U000e0080b")
    blanks += ("a\ufe00", "a\u180b", "a\u180f")  # the variation selectors' first and Mongolian's last
    blanks += ("a\xa0b", "a\u3000b", "a\u2028b", "a\ufff0b", "a\ue000b")  # other spaces, unassigned, private use
    for name in (" a", "a ", "a\tb", "a\nb", "a\x7f", "a\x9bb", "a\u200b", *blanks):
        with pytest.raises(ValueError, match="starts or ends with spaces or holds a control or invisible character"):
            store.snapshot(name)
    store.snapshot("a b")  # a space within is a name


def test_one_name_however_its_accents_are_typed(store):
    """ "café" as one character or as e + combining accent read alike and were two capsules."""
    composed, decomposed = "caf\u00e9", "cafe\u0301"
    store.snapshot(composed)
    assert store.restore(decomposed).name == composed and decomposed in store
    store.snapshot(decomposed)  # replaces it: one capsule
    assert [c.name for c in store.list()] == [composed]
    assert store.fork(decomposed, "copy\u0301").name == "cop\u00fd" and "copy\u0301" in store  # one spelling
    assert store.drop(decomposed).name == composed and composed not in store
    with pytest.raises(ValueError, match="at most 256 characters"):  # 200 characters, 400 once composed
        store.snapshot("\u0958" * 200)


def test_a_fork_carries_when_its_source_s_state_was_taken(state):
    """The fork's own time said nothing of when the state it holds was taken."""
    now = [100]
    store = CapsuleStore(state, clock_ns=lambda: now[0])
    store.snapshot("before")
    now[0] = 500
    assert store.fork("before", "copy").created_ns == 100


def test_capsule_buffers_cannot_be_changed_through_what_the_store_returns(state, store):
    capsule = store.snapshot("a")
    rng = capsule.buffers["rng"]
    with pytest.raises(ValueError, match="read-only"):
        rng[0] = 1
    with pytest.raises(ValueError, match="cannot set WRITEABLE flag to True"):
        rng.flags.writeable = True
    with pytest.raises(TypeError):
        capsule.buffers["rng"] = np.zeros(3, np.uint8)  # type: ignore[index]
    assert store.list()[0].buffers["rng"].tobytes() == state.read()["rng"].tobytes()


def test_write_checks_every_buffer_before_changing_any(state):
    """A malformed state (here a foreign one with no chunk counter value) is refused whole: the
    generator is not replaced first and left so."""
    good = state.read()
    state.decide(observation(0))
    live = state.read()
    h = state.pipeline.policy.cfg.horizon
    for broken, reason in [
        ({**good, "next_chunk_id": np.zeros(0, np.int64)}, r"next_chunk_id must be one integer >= 1, got int64\[0\]"),
        ({**good, "next_chunk_id": np.array([0])}, r"next_chunk_id must be one integer >= 1, got int64\[1\]=\[0\]"),
        # a counter that is no integer, or not one value: not cut or unwrapped into one
        ({**good, "next_chunk_id": np.array([2.7])}, r"next_chunk_id must be one integer >= 1, got float64\[1\]=\[2"),
        ({**good, "next_chunk_id": np.array([[5]])}, r"next_chunk_id must be one integer >= 1, got int64\[1, 1\]="),
        ({**good, "last_actions": np.zeros((0, 6), np.complex64)}, r"last_actions must be .*, got dtype complex64"),
        ({**good, "rng": good["rng"][:-1]}, r"rng must be uint8\[\d+\], got uint8\[\d+\]"),
        # the right size, but bytes the CPU's mt19937 refuses (torch raised RuntimeError, past the
        # services' refusals)
        ({**good, "rng": np.zeros_like(good["rng"])}, r"rng is not a state of this cpu generator \(Invalid mt19937"),
        ({**good, "last_actions": np.zeros((h, 5), np.float32)}, rf"last_actions must be \[{h}, 6\] .*, got \[{h}, 5"),
        # another pipeline's chunk (another horizon): not this pipeline's previous chunk
        ({**good, "last_actions": np.zeros((h + 3, 6), np.float32)}, rf"last_actions must be \[{h}, 6\] \(or \[0, 6\]"),
    ]:
        with pytest.raises(ValueError, match="pipeline state refused: " + reason):
            state.write(broken)
        after = state.read()
        assert all(after[k].tobytes() == live[k].tobytes() for k in live)


def test_write_checks_the_last_chunk_dtype_before_applying_anything(state):
    """last_actions of the right shape but not real numbers (strings, None in an object array)
    or not finite in float32: refused with rng and the counter of the offered state not applied."""
    good = state.read()  # another generator state and counter than the live ones below
    state.decide(observation(0))
    state.decide(observation(1))
    live = state.read()
    h = state.pipeline.policy.cfg.horizon
    with_none = np.array([[1, 2, 3, 4, 5, None]] * h, dtype=object)
    for actions, reason in [
        (np.full((h, 6), "x"), rf"last_actions must be float32\[{h}, 6\] \(real numbers\), got dtype <U1"),
        (with_none, rf"last_actions must be float32\[{h}, 6\] \(real numbers\), got dtype object"),
        (np.full((h, 6), 1e300), rf"last_actions must be finite in float32 .*, got 1e\+300 at \[0, 0\] \({6 * h} such"),
        (np.full((h, 6), np.nan, np.float32), r"last_actions must be finite in float32 .*, got nan at \[0, 0\]"),
    ]:
        broken = {**good, "next_chunk_id": np.array([42]), "last_actions": actions}
        with pytest.raises(ValueError, match="pipeline state refused: " + reason):
            state.write(broken)
        after = state.read()
        assert all(after[k].tobytes() == live[k].tobytes() for k in live)


def test_reset_returns_to_the_seed(state):
    first = run(state, range(2))
    state.reset()
    assert state.read()["last_actions"].shape == (0, 6)  # no chunk: a capsule taken now is a fresh one
    assert run(state, range(2)) == first
    assert first[0][0] == 1


def test_write_refuses_incomplete_state(state):
    with pytest.raises(ValueError, match="missing"):
        state.write({"rng": state.read()["rng"]})


def test_write_refuses_a_buffer_it_does_not_know(state):
    """Another pipeline's (or a later version's) buffer would be dropped without a word."""
    state.decide(observation(0))
    live = state.read()
    with pytest.raises(ValueError, match=r"missing \[\], unknown \['noise'\]"):
        state.write({**live, "noise": np.zeros(3, np.float32)})
    assert state.read()["next_chunk_id"].tolist() == live["next_chunk_id"].tolist()


def test_restore_is_byte_exact_on_the_fused_path():
    """The node's GPU path: Triton kernels (interpreted on a CPU) and, on a GPU, CUDA graphs with
    the noise from the captured generator."""
    from kernel_fixtures import DEVICE

    policy = default_policy(num_views=2, action_dof=6, seed=0, device=DEVICE)
    state = PipelineState(Pipeline(policy, seed=SEED, backend="fused"), SEED)
    assert state.pipeline.backend == "fused"
    store = CapsuleStore(state)
    run(state, range(2))
    store.snapshot("s")
    original = run(state, range(2, 5))
    store.fork("s", "f")
    run(state, range(5, 6))
    store.restore("f")
    assert run(state, range(2, 5)) == original


def test_refusals_quote_names_and_lists_bounded(store):
    """A 100,000-character name, or an unknown one among hundreds of capsules, makes a reply and a
    log line of bounded length that still say what was wrong."""
    for i in range(15):
        store.snapshot(f"c{i:02d}")
    with pytest.raises(CapsuleNotFound) as err:
        store.restore("nope")
    assert str(err.value).endswith("'c08', 'c09', and 5 more)") and len(str(err.value)) < 200, str(err.value)
    with pytest.raises(ValueError) as err:
        store.snapshot("x" * 100_000)
    assert str(err.value).endswith("... (100000 characters)") and len(str(err.value)) < 250, str(err.value)


def test_the_store_keeps_at_most_its_limit_of_capsules(state):
    """A client snapshotting under fresh names cannot grow the node without bound: a new name past
    the limit is refused, saying why and what to do; replacing a kept one and dropping still work."""
    store = CapsuleStore(state, limit=3)
    for name in ("a", "b", "c"):
        store.snapshot(name)
    for add in (lambda: store.snapshot("d"), lambda: store.fork("a", "d")):
        with pytest.raises(CapsuleStoreFull, match=r"cannot add capsule 'd': the store holds its limit of 3 capsules"):
            add()
    assert [c.name for c in store.list()] == ["a", "b", "c"]
    store.snapshot("b")  # a kept name is replaced, not added
    store.drop("c")
    store.fork("a", "d")
    assert [c.name for c in store.list()] == ["a", "b", "d"]


def test_the_kept_last_chunk_and_read_are_copies(policy) -> None:
    """`np.asarray(decision.actions)` kept the caller's chunk itself (a node that edits its
    decision's actions in place, e.g. limits, changed the state); read() handed out the live
    last_actions (a caller's write changed what the next snapshot saves)."""

    state = PipelineState(Pipeline(policy, seed=SEED), SEED)
    decision = state.decide(observation(0))
    kept = decision.actions.copy()
    decision.actions[:] = 0.0
    assert state.read()["last_actions"].tobytes() == kept.tobytes()
    state.read()["last_actions"][:] = 7.0
    assert state.read()["last_actions"].tobytes() == kept.tobytes()


def test_write_refuses_a_last_chunk_of_another_length(policy) -> None:
    """`shape[0] > horizon` took a last chunk of 3 rows for a horizon-long one (another
    pipeline's, or a truncated capsule)."""

    state = PipelineState(Pipeline(policy, seed=SEED), SEED)
    saved = state.read()
    dof = saved["last_actions"].shape[1]
    with pytest.raises(ValueError, match=r"last_actions must be \["):
        state.write({**saved, "last_actions": np.zeros((3, dof), np.float32)})


def test_a_non_finite_last_chunk_is_named_at_its_row_and_column(policy) -> None:
    """`divmod(i, horizon)` named the wrong [row, col] of the first non-finite value."""

    state = PipelineState(Pipeline(policy, seed=SEED), SEED)
    state.decide(observation(0))
    saved = state.read()
    bad = saved["last_actions"].copy()
    bad[1, 2] = np.nan
    with pytest.raises(ValueError, match=r"got nan at \[1, 2\] \(1 such values\)"):
        state.write({**saved, "last_actions": bad})


def test_a_name_of_257_characters_is_refused_and_256_taken() -> None:
    """`> 257` took a 257-character name (the limit the message and the node's docs state is 256)."""
    store = CapsuleStore(SimpleNamespace(read=lambda: {}, write=lambda s: None))
    with pytest.raises(ValueError, match="at most 256 characters"):
        store.snapshot("x" * 257)
    store.snapshot("x" * 256)
