"""Per-rank tables and stragglers from synthetic per-rank summaries (one per TP/EP rank of a server)."""

from rooftop.profile.ranks import component_spread, rank_stat, rank_table, stragglers
from rooftop.profile.summary import ComponentTime, ProfileSummary


def summary(busy_ms: float, comm_share: float, components: dict[str, float]) -> ProfileSummary:
    comps = [ComponentTime(name, name, ms / busy_ms, ms, {}) for name, ms in components.items()]
    return ProfileSummary(trace="t", basis="kernels", granularity="module", arch="sm_90", steps=10,
                          gpu_busy_ms_per_step=busy_ms, gpu_idle_share=0.05, components=comps,
                          categories={"gemm": 1.0 - comm_share, "communication": comm_share}, unit_shares={},
                          tensor_core_share=0.5, capacity_findings=[], top_kernels=[], notes=[])


def balanced(rank: int, comm_ms: float = 1.0, moe_ms: float = 4.0):
    busy = 2.0 + moe_ms + comm_ms
    return rank_stat(rank, f"rank{rank} on host {'a' if rank < 2 else 'b'}",
                     summary(busy, comm_ms / busy, {"attention": 2.0, "moe": moe_ms, "communication": comm_ms}))


def test_balanced_ranks_make_no_finding():
    stats = [balanced(r) for r in range(4)]
    assert stragglers(stats) == []
    rows = rank_table(stats)
    assert [r["rank"] for r in rows] == [0, 1, 2, 3]
    assert rows[0]["own_ms"] == 6.0 and abs(rows[0]["comm_ms"] - 1.0) < 1e-9 and rows[0]["own_vs_median"] == 0.0


def test_a_rank_whose_moe_is_slow_is_the_straggler_and_the_others_wait_for_it():
    # rank 3's experts take 6 ms instead of 4: its peers wait 2 ms more in all-reduce, so every busy time is 9 ms
    stats = [balanced(r, comm_ms=3.0) for r in range(3)] + [balanced(3, comm_ms=1.0, moe_ms=6.0)]
    assert {s.busy_ms for s in stats} == {9.0}  # step times alone would show nothing
    found = stragglers(stats)
    assert len(found) == 1, found
    assert found[0].startswith("Rank 3 (rank3 on host b) lags the others")
    assert "8.000 ms per step, 33% over the median rank's 6.000 ms" in found[0]
    assert "its moe takes 6.000 ms against 4.000 ms" in found[0]
    rows = {r["rank"]: r for r in rank_table(stats)}
    assert abs(rows[3]["own_vs_median"] - 1 / 3) < 1e-9 and rows[0]["own_vs_median"] == 0.0


def test_within_threshold_is_not_a_straggler():
    stats = [balanced(r) for r in range(3)] + [balanced(3, moe_ms=4.5)]  # own work 6.5 vs 6.0: 8%
    assert stragglers(stats) == []
    assert stragglers(stats, threshold=0.05)[0].startswith("Rank 3 ")


def test_component_spread_names_imbalanced_experts_even_when_own_work_evens_out():
    # rank 1 has the hot experts, rank 0 more attention: own work equal, moe spread 50%
    stats = [rank_stat(0, "r0", summary(10.0, 0.1, {"attention": 5.0, "moe": 4.0})),
             rank_stat(1, "r1", summary(10.0, 0.1, {"attention": 3.0, "moe": 6.0})),
             rank_stat(2, "r2", summary(10.0, 0.1, {"attention": 5.0, "moe": 4.0}))]
    assert component_spread(stats)["moe"] == (4.0, 6.0, 1)
    (found,) = stragglers(stats)
    assert found.startswith("moe time differs across ranks: 6.000 ms per step on rank 1 against a median of 4.000")
    assert "experts imbalanced" in found


def test_one_rank_makes_no_comparison():
    assert stragglers([balanced(0)]) == [] and component_spread([]) == {}


def test_the_campaign_diagnosis_lifts_a_straggler_from_the_baselines_profile():
    from rooftop.campaign.diagnosis import rule_ranks
    from rooftop.campaign.evidence import Evidence, ProfileEvidence

    stats = [balanced(r, comm_ms=3.0) for r in range(3)] + [balanced(3, comm_ms=1.0, moe_ms=6.0)]
    notes = ["attributed by module frames", *stragglers(stats)]

    def prof(path):
        return ProfileEvidence(variant="v", trace_path=path, concurrency=8, steps=10, busy_ms_per_step=9.0,
                               idle_share=0.05, tensor_core_share=0.5, components=[], capacity_findings=[],
                               notes=notes)

    ev = Evidence(campaign="c", goal="g", mode="independent", baseline="base", variants={}, levers=[],
                  profiles={"base/decode": prof("traces/base/decode/x-TP-0.trace.json.gz"), "lever": prof("l")})
    (finding,) = rule_ranks(ev)
    assert finding.title == "A rank lags the others" and finding.sentence == notes[1]
    assert finding.evidence_pointer == "profile traces/base/decode/x-TP-0.trace.json.gz (every rank)"


def test_rank_report_on_real_traces_names_the_rank_whose_indexer_works_on_capacity(tmp_path):
    """Two H200 traces of the same model as two 'ranks': one whose indexer is bounded by the capacity
    (262144 tokens), one by the actual context. The first lags, and the indexer is where."""
    from pathlib import Path

    from rooftop.profile import analyze, load_trace
    from rooftop.profile.ranks import rank_report

    data = Path(__file__).parent / "data"
    traces = [data / "h200_capacity_ctx262144.json.gz", data / "h200_actual_ctx262144.json.gz"]
    first = analyze(load_trace(traces[0]))
    table, found = rank_report(traces, first, lambda p: analyze(load_trace(p)))
    assert [row["rank"] for row in table] == [0, 1] and table[0]["busy_ms"] > table[1]["busy_ms"]
    assert table[0]["own_vs_median"] > 0.10
    assert found and found[0].startswith("Rank 0 (h200_capacity_ctx262144.json.gz) lags the others")
    assert "its indexer takes" in found[0]


def test_ranks_and_labels_come_from_the_trace_files():
    """The rank a trace's name gives (not its position), and its host where traces lie in per-host directories;
    positions where names give no rank or give one twice."""
    from pathlib import Path

    from rooftop.profile.ranks import trace_labels

    spread = [Path("out/a/x-TP-0.trace.json.gz"), Path("out/b/x-TP-2.trace.json.gz")]
    assert trace_labels(spread) == [(0, "x-TP-0.trace.json.gz on a"), (2, "x-TP-2.trace.json.gz on b")]
    one_dir = [Path("out/dp0_pp0_tp0_rank0.1.pt.trace.json.gz"), Path("out/dp0_pp0_tp1_rank1.1.pt.trace.json.gz")]
    assert [r for r, _ in trace_labels(one_dir)] == [0, 1] and trace_labels(one_dir)[1][1] == one_dir[1].name
    assert [r for r, _ in trace_labels([Path("a/x.json"), Path("a/y.json")])] == [0, 1]
    assert [r for r, _ in trace_labels([Path("a/TP-1.json"), Path("b/TP-1.json")])] == [0, 1]


def test_rank_report_numbers_ranks_by_their_files():
    from pathlib import Path

    from rooftop.profile.ranks import rank_report

    traces = [Path("out/a/x-TP-0.trace.json.gz"), Path("out/b/x-TP-2.trace.json.gz")]
    table, _ = rank_report(traces, summary(7.0, 1 / 7, {"moe": 4.0}), lambda p: summary(7.0, 1 / 7, {"moe": 4.0}))
    assert [(r["rank"], r["label"]) for r in table] == [(0, "x-TP-0.trace.json.gz on a"), (2, "x-TP-2.trace.json.gz on b")]
