"""The benchmark's measurement of a package on every core (pipeline/measure/cores.py): one thread, N
threads and N child processes taking turns in one process, run as the stage runs it (a job in a
fresh process); the report's line names the faster way's serve flags."""

from __future__ import annotations

import pytest

from pipeline.measure.cores import best_mode, cores_line
from pipeline.measure.jobs import CoresJob
from pipeline.measure.process import run_process
from pipeline.report.markdown import cores_lines
from tests.helpers import multi30k_head


def test_a_package_on_two_cores_three_ways_in_a_fresh_process(package, data_dir, tmp_path):
    sentences = [s[:40] for s in multi30k_head(data_dir, "en", 24)]
    result = run_process(tmp_path, "cores", CoresJob(str(package), 2, sentences, [1, 2], 4, 2), 2)
    assert not result.get("skipped"), result
    assert (result["cores"], result["batch"], result["sentences"], result["rounds"]) == (2, 4, 24, 2)
    assert [p["beam"] for p in result["points"]] == [1, 2]
    for point in result["points"]:
        assert point["same"] is True  # every mode gives one thread's translations
        assert all(v > 0 for v in point["sent_per_s"].values())
        assert set(point["speedup"]) == {"threads", "processes"}
    assert result["best"] == best_mode(result["points"])
    line = cores_line(result)
    assert line.startswith("greedy: 1 thread ") and "; beam 2: 1 thread " in line
    assert "mt-runtime serve --threads" in line and "DIFFER" not in line


def test_the_faster_way_over_the_beams_and_its_serve_flags():
    def point(beam, threads, processes, same=True):
        speed = {"one": 100.0, "threads": 100 * threads, "processes": 100 * processes}
        speedup = {"threads": threads, "processes": processes}
        return {"beam": beam, "sent_per_s": speed, "speedup": speedup, "same": same}

    result = {"cores": 4, "batch": 32, "sentences": 1000, "rounds": 5}
    processes = {**result, "points": [point(1, 2.9, 3.6), point(4, 3.5, 3.4)]}
    processes["best"] = best_mode(processes["points"])
    assert processes["best"] == "processes"  # 3.6 x 3.4 over 2.9 x 3.5
    assert "faster here: 4 processes (mt-runtime serve --threads 1 --processes 4;" in cores_line(processes)
    threads = {**result, "points": [point(1, 3.0, 2.0, same=False)]}
    threads["best"] = best_mode(threads["points"])
    assert threads["best"] == "threads"
    line = cores_line(threads)
    assert "(mt-runtime serve --threads 4;" in line and "4 processes 200 (2.00x) (TRANSLATIONS DIFFER" in line
    assert best_mode([]) is None
    assert cores_line({"skipped": "no child"}) == "skipped: no child"
    rows = [{"name": "int8_static", "cores": threads}, {"name": "teacher"}]
    lines = cores_lines(rows)
    assert lines[1].startswith("**On every core**") and lines[3].startswith("- int8_static: greedy: 1 thread 100")
    assert cores_lines([{"name": "teacher"}]) == []


def test_the_sample_fills_every_core():
    from pipeline.measure.peers import enough_for

    sample = [f"s{i}" for i in range(1000)]
    assert enough_for(sample, 32, 2) is sample  # 1000 >= 4 batches of 32 for 2 cores
    many = enough_for(sample, 32, 64)  # 64 cores: 4 x 32 x 64 sentences, the test set repeated
    assert len(many) == 8192 and many[:1000] == sample and many[1000:2000] == sample and many[-1] == "s191"


@pytest.mark.parametrize("bad", [{"rounds": -1}, {"beam": [1]}])
def test_the_recipe_section_is_typed(bad):
    from pydantic import ValidationError

    from pipeline.stages.benchmark import CoresConfig

    with pytest.raises(ValidationError):
        CoresConfig(**bad)
    assert CoresConfig().model_dump() == {"sentences": 1000, "beams": [1, 4], "rounds": 5}
