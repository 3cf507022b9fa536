"""Scores over a head dimension that a de-interleaving view splits in two variables: DeepSeek's multi-head latent
attention (its RoPE part viewed as (d/2, 2) and transposed, joined to the no-RoPE part by cat) and GPT-J's
every-other-channel rotation. The loop form sums the scores over both variables, a double sum whose summand is
a tile over one variable too many; the kernel sums the outer, short one a value at a time (Schedule.steps),
each value's sum a tl.dot (many queries) or a tile sum (one query). Both fell back to eager before, with "a sum
over a product of three loop variables that is not a contraction"."""
import pytest
import torch
from test_fuzz import run_spec

from conftest import assert_held_fuses
from flashtensor import driver
from flashtensor.bench import programs
from flashtensor.options import Options
from fuzz_programs import Spec


@pytest.mark.unit
def test_mla_scores_schedule_as_dots_summed_over_the_split():
    """At a length no tile holds whole, the first candidate schedules: one kernel over query tiles and a loop over
    key tiles whose scores are a dot per value of the short variable (planned on meta tensors: nothing runs)."""
    fn, args = programs.make("deepseek_mla", device="cpu", dtype=torch.float16, **{**programs.GPU, "S": 512})
    meta = [torch.empty_like(a, device="meta") for a in args]
    k, plan = next(iter(driver.candidate_plans(fn, meta, Options())))
    (schedule,) = plan.stages["schedule"][k]
    assert len(schedule.steps) == 1 and set(schedule.steps) <= set(schedule.dots)
    (var,) = schedule.steps.values()
    assert var in schedule.whole and var.extent <= 16


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_mla_fuses_into_one_kernel_at_a_length_no_tile_holds(dtype):
    """DeepSeek-V3's eager attention at 300 positions: one kernel, eager's answer under the contract."""
    assert_held_fuses("deepseek_mla", dtype, dict(B=1, H=2, S=300, D=16, KV=1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_query_with_every_other_rotation_and_a_column_statistic_fuses(dtype):
    """A decode step (one query) of GPT-J's rotary attention returning its probabilities as the column statistic:
    each value of the split's short variable is a tile sum of q * k over the other, the scores their sum."""
    spec = Spec("softmax", batch=1, heads=2, kv_heads=2, q_len=1, kv_len=70, dim=32, dtype=dtype, rope=True,
                rope_style="every_two", stats=("colsum",), seed=int(torch.randint(1 << 30, ())))
    (program,) = run_spec(spec, resize=False)
    assert program.launches and not program.notes, program.notes
    assert any("for i_v" in la.source.source for la in program.launches)
