"""tools/collectives.py: each collective of a compiled program counted once per run, read from
hand-written HLO that plants each way a line counter goes wrong: a collective split over
async pieces that share a channel id, one inside a conditional's branch, loops whose trip
count XLA does not state (a non-zero start, a GT countdown, an NE test, a fused compare),
replica groups in every printed form, and groups it cannot read. No JAX, no compile: these
run in milliseconds.
"""

import numpy as np

from transformer.tools import collectives

MESH, AXES = (2, 2, 2), ("data", "fsdp", "tensor")


def read(hlo):
    ops, unknown = collectives.read(hlo, MESH, AXES)
    return collectives.totals(ops), ops, unknown


def loop(init: int, limit: int, direction: str, step: str = "add", delta: int = 1,
         fused: bool = False, known: int | None = None) -> str:
    """A while loop whose body all-gathers 4x64 bf16 once per trip."""
    compare = f"compare(%i, %n), direction={direction}"
    cond = (f"""%fcmp (a: s32[], b: s32[]) -> pred[] {{
  %a = s32[] parameter(0)
  %b = s32[] parameter(1)
  ROOT %c = pred[] compare(%a, %b), direction={direction}
}}

%cond (p: (s32[], bf16[1,64])) -> pred[] {{
  %p = (s32[], bf16[1,64]) parameter(0)
  %n = s32[] constant({limit})
  %i = s32[] get-tuple-element(%p), index=0
  ROOT %f = pred[] fusion(%i, %n), kind=kLoop, calls=%fcmp
}}""" if fused else f"""%cond (p: (s32[], bf16[1,64])) -> pred[] {{
  %p = (s32[], bf16[1,64]) parameter(0)
  %n = s32[]{{:T(128)}} constant({limit})
  %i = s32[] get-tuple-element(%p), index=0
  ROOT %lt = pred[] {compare}
}}""")
    backend = f', backend_config={{"known_trip_count":{{"n":"{known}"}}}}' if known else ""
    return f"""HloModule m

{cond}

%body (q: (s32[], bf16[1,64])) -> (s32[], bf16[1,64]) {{
  %q = (s32[], bf16[1,64]) parameter(0)
  %j = s32[] get-tuple-element(%q), index=0
  %x = bf16[1,64] get-tuple-element(%q), index=1
  %one = s32[] constant({delta})
  %next = s32[] {step}(%j, %one)
  %ag = bf16[4,64]{{1,0}} all-gather(%x), channel_id=1, replica_groups=[2,4]<=[8], dimensions={{0}}
  %s = bf16[1,64] slice(%ag), slice={{[0:1], [0:64]}}
  ROOT %t = (s32[], bf16[1,64]) tuple(%next, %s)
}}

ENTRY %main (a: bf16[1,64]) -> (s32[], bf16[1,64]) {{
  %a = bf16[1,64] parameter(0)
  %zero = s32[] constant({init})
  %t0 = (s32[], bf16[1,64]) tuple(%zero, %a)
  ROOT %w = (s32[], bf16[1,64]) while(%t0), condition=%cond, body=%body{backend}
}}
"""


AG = 4 * 64 * 2  # one gathered bf16[4,64]


def test_a_scan_counts_its_body_once_per_trip():
    found, ops, unknown = read(loop(0, 96, "LT"))
    assert found["all-gather"] == {"count": 96, "bytes": 96 * AG} and unknown == []


def test_known_trip_count_wins():
    found, _, _ = read(loop(0, 96, "LT", known=12))
    assert found["all-gather"]["count"] == 12


def test_loops_a_line_counter_got_wrong():
    """The old counter read `compare LT constant` as 0..n-1 and anything else as one trip."""
    cases = [(loop(2, 10, "LT"), 8),                        # a non-zero start: not 10
             (loop(10, 0, "GT", "subtract"), 10),           # a countdown: not 1
             (loop(0, 5, "NE"), 5),                          # i != 5: not 1
             (loop(0, 6, "LT", delta=2), 3),                 # a step of 2: not 6
             (loop(0, 7, "LE"), 8),
             (loop(0, 9, "LT", fused=True), 9)]              # the compare inside a fusion
    for hlo, trips in cases:
        found, _, unknown = read(hlo)
        assert found["all-gather"]["count"] == trips and unknown == [], (trips, found)


def test_a_loop_whose_trip_count_cannot_be_read_is_reported_unknown():
    hlo = loop(0, 5, "LT").replace("%next = s32[] add(%j, %one)",
                                   "%next = s32[] multiply(%j, %one)")
    found, _, unknown = read(hlo)
    assert [u["loop"] for u in unknown] == ["w"] and found["all-gather"]["count"] == 1


SPLIT = """HloModule m

%async_collective_fusion.1 (p0: bf16[16,64]) -> (bf16[16,64], bf16[64,64]) {
  %p0 = bf16[16,64] parameter(0)
  %all-gather.1 = bf16[64,64]{1,0:T(8,128)(2,1)} all-gather(%p0), channel_id=7, replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_1'}, dimensions={0}, use_global_device_ids=true, metadata={op_name="jit(step)/jvp(GPT)/mlp/expand/dot_general"}
  ROOT %cc = (bf16[16,64], bf16[64,64]) custom-call(%all-gather.1), custom_call_target="AsyncCollectiveStart"
}

%async_collective_fusion.2 (p1: bf16[16,64]) -> bf16[64,64] {
  %p1 = bf16[16,64] parameter(0)
  %all-gather.2 = bf16[64,64]{1,0} all-gather(%p1), channel_id=7, replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_1'}, dimensions={0}, use_global_device_ids=true
  ROOT %done = bf16[64,64] custom-call(%all-gather.2), custom_call_target="AsyncCollectiveDone"
}

%wrapped_reduce_scatter (w: f32[64,64]) -> f32[16,64] {
  %w = f32[64,64] parameter(0)
  ROOT %rs = f32[16,64]{1,0} reduce-scatter(%w), channel_id=9, replica_groups=[2,4]<=[2,4], dimensions={0}, to_apply=%add
}

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

%yes (t: f32[8]) -> f32[8] {
  %t = f32[8] parameter(0)
  ROOT %ar = f32[8]{0} all-reduce(%t), channel_id=11, replica_groups={{0,4},{1,5},{2,6},{3,7}}, to_apply=%add
}

%no (u: f32[8]) -> f32[8] {
  ROOT %u = f32[8] parameter(0)
}

ENTRY %main (a: bf16[16,64], g: f32[64,64], c: pred[], v: f32[8]) -> f32[8] {
  %a = bf16[16,64] parameter(0)
  %g = f32[64,64] parameter(1)
  %c = pred[] parameter(2)
  %v = f32[8] parameter(3)
  %start = (bf16[16,64], bf16[64,64]) fusion(%a), kind=kCustom, calls=%async_collective_fusion.1
  %update = (bf16[16,64], bf16[64,64]) fusion(%a), kind=kCustom, calls=%async_collective_fusion.1
  %gathered = bf16[64,64] fusion(%a), kind=kCustom, calls=%async_collective_fusion.2
  %rs-start = ((f32[64,64]), f32[16,64]) async-start(%g), calls=%wrapped_reduce_scatter
  %rs-done = f32[16,64] async-done(%rs-start), calls=%wrapped_reduce_scatter
  %ag2-start = (bf16[16,64], bf16[32,64]) all-gather-start(%a), channel_id=12, replica_groups=[4,2]<=[8], dimensions={0}
  %ag2-done = bf16[32,64] all-gather-done(%ag2-start)
  %rs2-start = ((f32[64,64], f32[8]), (f32[16,64], f32[2])) reduce-scatter-start(%g, %v), channel_id=13, replica_groups=[2,4]<=[8], dimensions={0}, to_apply=%add
  %rs2-done = (f32[16,64], f32[2]) reduce-scatter-done(%rs2-start)
  ROOT %branch = f32[8] conditional(%c, %v, %v), true_computation=%yes, false_computation=%no
}
"""


def test_a_split_async_collective_counts_once():
    """Three pieces of channel 7 (start, update, done) are one all-gather of 64x64 bf16; the
    async-start and -done of a wrapped reduce-scatter one reduce-scatter of its operand; a
    GPU's reduce-scatter-start ((operands), (results)) one, of its operands."""
    found, ops, _ = read(SPLIT)
    assert found["all-gather"] == {"count": 2, "bytes": 64 * 64 * 2 + 32 * 64 * 2}
    assert found["reduce-scatter"] == {"count": 2, "bytes": 64 * 64 * 4 * 2 + 8 * 4}
    gather = next(o for o in ops if o.name == "all-gather.1")
    assert gather.axes == ("fsdp", "tensor") and gather.group == 4
    assert gather.op_name.endswith("mlp/expand/dot_general")


def test_a_collective_in_a_conditional_branch_is_counted_and_marked():
    found, ops, _ = read(SPLIT)
    assert found["all-reduce"] == {"count": 1, "bytes": 32}
    (ar,) = [o for o in ops if o.kind == "all-reduce"]
    assert ar.in_branch and ar.axes == ("data",)


def test_replica_groups_in_each_form_and_the_axes_they_span():
    assert collectives.replica_groups("replica_groups=[2,4]<=[8]").tolist() == \
        [[0, 1, 2, 3], [4, 5, 6, 7]]
    groups = collectives.replica_groups("replica_groups=[4,2]<=[2,4]T(1,0)")
    assert groups.tolist() == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert collectives.spanned(groups, MESH, AXES) == ("data",)
    named = collectives.replica_groups(
        "replica_groups=mesh['axis_0'=2,'axis_1'=2,'axis_2'=2] {'axis_0','axis_2'}")
    assert named.tolist() == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert collectives.spanned(named, MESH, AXES) == ("data", "tensor")
    assert collectives.replica_groups("replica_groups={}", 8).shape == (1, 8)
    # GPU hosts: mesh positions mapped to devices by a transposed iota (fsdp 8 x data 2 on
    # two 8-GPU hosts): a group along axis_2 stays inside one host
    hosts = collectives.replica_groups("replica_groups=mesh['axis_0'=1,'axis_1'=1,'axis_2'=8,"
                                       "'axis_3'=2], device_ids=([2,8]T(1,0)) {'axis_2'}")
    assert hosts.tolist() == [list(range(8)), list(range(8, 16))]
    across = collectives.replica_groups("replica_groups=mesh['axis_0'=8,'axis_1'=2], "
                                        "device_ids=([2,8]T(1,0)) {'axis_1'}")
    assert across.tolist()[0] == [0, 8]
    assert collectives.spanned(np.array([[0, 1]]), MESH, AXES) == ("tensor",)


def test_unreadable_groups_are_unknown_and_a_reduce_scatter_still_counts_its_operand():
    """The old counter took an unreadable group as 1: a reduce-scatter's bytes n x too small."""
    hlo = """HloModule m

ENTRY %main (g: f32[64,64]) -> f32[16,64] {
  %g = f32[64,64] parameter(0)
  ROOT %rs = f32[16,64]{1,0} reduce-scatter(%g), channel_id=3, replica_groups=somehow<new>, dimensions={0}
}
"""
    found, ops, _ = read(hlo)
    assert found["reduce-scatter"]["bytes"] == 64 * 64 * 4
    assert ops[0].group is None and ops[0].axes == ()
    assert collectives.by_axes(ops) == {("reduce-scatter", "unknown groups"): 64 * 64 * 4}


def test_top_lists_the_largest_first():
    _, ops, _ = read(SPLIT)
    rows = collectives.top(ops, 2)
    assert [r["kind"] for r in rows] == ["reduce-scatter", "reduce-scatter"]
    assert rows[0]["total_bytes"] == 64 * 64 * 4 + 8 * 4


def test_a_transfer_between_slices_is_a_dcn_collective():
    """libtpu compiles one slice's program; what crosses the data-center network is a
    host-transfer send (and its recv) to the megascale runtime, not a replica group."""
    hlo = """HloModule m

ENTRY %main (g: f32[6,8,128]) -> f32[6,8,128] {
  %g = f32[6,8,128] parameter(0)
  %after-all = token[] after-all()
  %send = (f32[6,8,128]{2,1,0:T(8,128)}, u32[], token[]) send(%g, %after-all), channel_id=5, is_host_transfer=true, frontend_attributes={_xla_host_transfer_handler_name="xla_megascale_runtime",_xla_host_transfer_rendezvous="all-reduce.71_0",_xla_megascale_reduce_operation="SUM",_xla_megascale_target="{1,2}x{0:3}",_xla_megascale_transfer_type="ALL_REDUCE"}
  %recv = (f32[6,8,128]{2,1,0:T(8,128)}, u32[], token[]) recv(%after-all), channel_id=2, is_host_transfer=true, frontend_attributes={_xla_host_transfer_handler_name="xla_megascale_runtime",_xla_host_transfer_rendezvous="all-reduce.71_0",_xla_megascale_transfer_type="ALL_REDUCE"}
  ROOT %r = f32[6,8,128] get-tuple-element(%recv), index=0
}
"""
    found, ops, _ = read(hlo)
    assert found["all-reduce"] == {"count": 1, "bytes": 6 * 8 * 128 * 4}
    assert ops[0].network == "dcn"


def test_a_fingerprint_covers_the_computations_not_the_source_tables():
    """TPU HLO prints its source-location tables before the computations: stripping them must
    keep every instruction (a fingerprint of the header alone matched any two programs)."""
    from transformer.tools import program
    head = 'HloModule m\n\nFileNames\n1 "/a.py"\n\nStackFrames\n1 {file_location_id=1}\n\n'
    one = head + "ENTRY %e {\n  ROOT %x = f32[] constant(1), metadata={op_name=\"a\"}\n}\n"
    two = one.replace("constant(1)", "constant(2)")
    moved = one.replace('op_name=\\"a\\"', 'op_name=\\"b\\"').replace("/a.py", "/b.py")
    assert program.fingerprint(one) != program.fingerprint(two)
    assert program.fingerprint(one) == program.fingerprint(moved)
    assert "constant(1)" in program.stripped(one) and "op_name" not in program.stripped(one)
