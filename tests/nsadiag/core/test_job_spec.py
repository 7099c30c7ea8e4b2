"""The job file a child reads: which jobs run under torchrun, and the torchrun field's
round trip and refusal."""

import json

import pytest

from nsadiag.spec import JobSpec, TrialSpec


def test_a_job_is_ranked_with_several_processes_or_when_asked(tmp_path):
    spec = TrialSpec(target="nsa", out_dir=str(tmp_path))
    assert not JobSpec("trial", spec).ranked
    assert JobSpec("trial", spec, world_size=2).ranked
    one_rank = JobSpec.from_json(JobSpec("trial", spec, torchrun=True).to_json())
    assert (one_rank.world_size, one_rank.torchrun, one_rank.ranked) == (1, True, True)


def test_a_torchrun_field_that_is_not_a_bool_is_refused(tmp_path):
    data = json.loads(JobSpec("trial", TrialSpec(target="nsa", out_dir=str(tmp_path))).to_json())
    data["torchrun"] = "yes"
    with pytest.raises(ValueError, match=r"^torchrun: must be true or false, got 'yes'$"):
        JobSpec.from_json(json.dumps(data))
