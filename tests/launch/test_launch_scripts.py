"""launch/*.sh: `bash -n` clean, and `--dry-run` prints the commands each script would run (the
interpreter check, the install with the right extra, the cluster variables, the detached run)."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = ["gpu_node.sh", "tpu_pod.sh", "distill_h200.sh", "hybrid_study_h200.sh", "h200_env.sh",
           "medium_pilot_h200.sh"]


def run(script, *args, **env):
  # PYTHON: this interpreter (>= 3.11), so the scripts need not probe python3.13 ... python3
  full = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"), "PYTHON": sys.executable,
          **env}
  return subprocess.run(["bash", os.path.join(ROOT, "launch", script), *args], env=full,
                        capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("script", SCRIPTS)
def test_scripts_parse(script):
  assert subprocess.run(["bash", "-n", os.path.join(ROOT, "launch", script)]).returncode == 0


def test_gpu_node_one_node_dry_run():
  out = run("gpu_node.sh", "--dry-run", "--gpus", "2", "--config.train.steps=10", CUDA="12",
            CONFIG="configs/quickstart.py:gdn", WORKDIR="runs/x")
  assert out.returncode == 0, out.stderr
  lines = out.stdout.splitlines()
  assert any("-m venv .venv" in l for l in lines)
  assert any("pip install -q -e .\\[cuda12\\]" in l for l in lines)
  assert "+ export CUDA_VISIBLE_DEVICES=0,1" in lines
  assert lines[-1] == ("+ .venv/bin/python -m lineax_lm.train --config configs/quickstart.py:gdn "
                       "--workdir runs/x --config.train.steps=10")


def test_gpu_node_several_nodes_dry_run():
  out = run("gpu_node.sh", "--dry-run", "--nodes", "2", "--node-rank", "1", "--coordinator",
            "10.0.0.2:1234", "--detach", CONFIG="c.py", WORKDIR="gs://b/x", VENV="none", CUDA="13")
  assert out.returncode == 0, out.stderr
  assert "+ export JAX_COORDINATOR_ADDRESS=10.0.0.2:1234 JAX_NUM_PROCESSES=2 JAX_PROCESS_ID=1" in out.stdout
  assert "pip install" not in out.stdout                     # VENV=none: the interpreter as it is
  assert out.stdout.splitlines()[-1].startswith(f"+ nohup {sys.executable} -m lineax_lm.train")
  assert out.stdout.splitlines()[-1].endswith("--workdir gs://b/x >> lineax_train.log 2>&1 &")


@pytest.mark.parametrize("args, message", [
    (["--nodes", "2"], "need all of --nodes, --node-rank and --coordinator"),
    (["--nodes", "2", "--node-rank", "2", "--coordinator", "h:1"], "--node-rank must be in 0..1"),
    (["--gpus", "9"], "--gpus must be 1..8"),
    (["--slurm"], "not inside a SLURM allocation"),
])
def test_gpu_node_errors(args, message):
  out = run("gpu_node.sh", "--dry-run", *args, CONFIG="c.py", WORKDIR="w", VENV="none")
  assert out.returncode == 2 and message in out.stderr


def test_gpu_node_rejects_an_old_python():
  out = run("gpu_node.sh", "--dry-run", CONFIG="c.py", WORKDIR="w", PYTHON="false")
  assert out.returncode == 2 and "needs Python >= 3.11" in out.stderr


def test_tpu_pod_dry_run():
  out = run("tpu_pod.sh", "--dry-run", "--config.train.steps=10", TPU_NAME="t", ZONE="z",
            REPO="https://example.org/lineax_lm.git", CONFIG="configs/quickstart.py:gdn",
            WORKDIR="gs://b/runs/x", ACCELERATOR="v5p-16", VERSION="v2-alpha-tpuv5", SPOT="1")
  assert out.returncode == 0, out.stderr
  text = out.stdout
  assert ("+ gcloud compute tpus tpu-vm create t --zone z --accelerator-type v5p-16 --version "
          "v2-alpha-tpuv5 --spot") in text
  assert "+ gcloud compute tpus tpu-vm ssh t --zone z --worker=all" in text
  assert "sys.version_info < (3, 11)" in text                       # the interpreter check
  assert "git clone --branch main https://example.org/lineax_lm.git lineax_lm" in text
  assert "pip install -q -e '.[tpu]'" in text
  assert ("nohup .venv/bin/python -m lineax_lm.train --config configs/quickstart.py:gdn --workdir "
          "gs://b/runs/x --config.train.steps=10 >> $HOME/lineax_train.log 2>&1 &") in text
  assert "a run is still going" in text                             # rerun: a live run is kept
  # the step compiled for the slice's chips first (lineax_lm.train.aot)
  check = (f"+ {sys.executable} -m lineax_lm.train --config configs/quickstart.py:gdn --aot=v5p-16 "
           "--config.train.steps=10")
  assert text.index(check) < text.index("tpu-vm create")


def test_tpu_pod_logs_stop_and_errors():
  env = dict(TPU_NAME="t", ZONE="z")
  assert "--worker=0 --command" in run("tpu_pod.sh", "--dry-run", "--logs", **env).stdout
  assert "kill -TERM" in run("tpu_pod.sh", "--dry-run", "--stop", **env).stdout
  local = run("tpu_pod.sh", "--dry-run", CONFIG="c.py", WORKDIR="runs/x", REPO="https://e/r", **env)
  assert local.returncode == 2 and "must be a gs:// path" in local.stderr
  no_repo = run("tpu_pod.sh", "--dry-run", CONFIG="c.py", WORKDIR="gs://b/x", **env)
  assert no_repo.returncode == 2 and "set REPO" in no_repo.stderr


def test_tpu_pod_without_a_topology_asks_for_one_or_the_skip_flag():
  env = dict(TPU_NAME="t", ZONE="z", CONFIG="c.py", WORKDIR="gs://b/x", REPO="https://e/r")
  out = run("tpu_pod.sh", "--dry-run", **env)
  assert out.returncode == 2 and "set ACCELERATOR or AOT_TOPOLOGY" in out.stderr
  skipped = run("tpu_pod.sh", "--dry-run", "--skip-aot-check", **env)
  assert skipped.returncode == 0 and "--aot" not in skipped.stdout


@pytest.mark.tpu_aot
def test_tpu_pod_refuses_a_config_whose_step_does_not_compile_for_the_slice():
  out = run("tpu_pod.sh", "--config.mesh.tensor=3", TPU_NAME="t", ZONE="z", REPO="https://e/r",
            CONFIG="configs/quickstart.py:gdn", WORKDIR="gs://b/x", ACCELERATOR="v5e-4",
            PYTHONPATH=os.environ.get("PYTHONPATH", ""))
  assert out.returncode == 2
  assert "'tensor': 3" in out.stderr and "does not compile or fit on v5e-4" in out.stderr


def test_h200_env_installs_only_what_is_missing(tmp_path):
  # The venv has every lineax_lm module: nothing to install. A module that no interpreter has and
  # no wheel in .whl/ provides is named.
  env_sh = os.path.join(ROOT, "launch", "h200_env.sh")
  bin_dir = os.path.dirname(sys.executable)
  script = (f"source {env_sh} && install_missing_wheels && echo PYTHONPATH=$PYTHONPATH && "
            "install_missing_wheels no_such_module:no-such-wheel; echo rc=$?")
  out = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True,
                       timeout=120, env={"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp_path)})
  assert f"PYTHONPATH=/tmp/site:{tmp_path}" in out.stdout, out.stdout + out.stderr
  assert "installing" not in out.stdout
  assert "missing module no_such_module and no .whl/no-such-wheel-*.whl" in out.stdout
  assert out.stdout.strip().endswith("rc=2")


def test_h200_env_takes_earlier_results_from_an_archive_or_a_folder(tmp_path):
  # The grid launch scripts' RESULTS_IN: a call's grid_results.tgz or a committed results folder;
  # a cell already in the grid folder is kept; anything else is refused, naming it.
  env_sh = os.path.join(ROOT, "launch", "h200_env.sh")
  cells = tmp_path / "results" / "cells"
  for cell in ("a", "b"):
    (cells / cell).mkdir(parents=True)
    (cells / cell / "result.json").write_text(f'{{"cell": "{cell}"}}')
  subprocess.run(["tar", "czf", str(tmp_path / "grid_results.tgz"), "-C", str(tmp_path / "results"),
                  "cells"], check=True)
  for source in ("grid_results.tgz", "results"):
    grid = tmp_path / f"grid_{source}"
    (grid / "cells" / "a").mkdir(parents=True)
    (grid / "cells" / "a" / "result.json").write_text('{"cell": "kept"}')
    out = subprocess.run(["bash", "-c", f"source {env_sh} && take_results {source} {grid}"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert (grid / "cells" / "a" / "result.json").read_text() == '{"cell": "kept"}'
    assert (grid / "cells" / "b" / "result.json").read_text() == '{"cell": "b"}'
  out = subprocess.run(["bash", "-c", f"source {env_sh} && take_results no_such_thing {tmp_path}"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=60)
  assert out.returncode == 2
  assert "RESULTS_IN=no_such_thing is neither a results archive nor a folder" in out.stdout


def test_h200_env_starts_and_quits_an_mps_daemon_of_its_own(tmp_path):
  # start_mps: the daemon started with the call's own pipe folder, exported for the processes
  # after it; stop_mps sends it "quit". Without the control binary it refuses, naming it.
  env_sh = os.path.join(ROOT, "launch", "h200_env.sh")
  fake = tmp_path / "bin" / "nvidia-cuda-mps-control"
  fake.parent.mkdir()
  calls = tmp_path / "calls"
  fake.write_text(f"#!/bin/bash\nif [ \"$1\" = -d ]; then echo \"daemon $CUDA_MPS_PIPE_DIRECTORY\" "
                  f">> {calls}; else read line; echo \"command $line\" >> {calls}; fi\n")
  fake.chmod(0o755)
  script = (f"source {env_sh} && start_mps {tmp_path}/mps && echo pipe=$CUDA_MPS_PIPE_DIRECTORY && "
            "stop_mps && echo after=${CUDA_MPS_PIPE_DIRECTORY:-unset}")
  path = f"{fake.parent}:{os.environ['PATH']}"
  out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60,
                       env={"PATH": path, "HOME": str(tmp_path)})
  assert out.returncode == 0, out.stdout + out.stderr
  assert f"pipe={tmp_path}/mps/pipe" in out.stdout and "after=unset" in out.stdout
  assert calls.read_text().splitlines() == [f"daemon {tmp_path}/mps/pipe", "command quit"]
  out = subprocess.run(["bash", "-c", f"source {env_sh} && stop_mps && echo pipe=$CUDA_MPS_PIPE_DIRECTORY"],
                       capture_output=True, text=True, timeout=60,  # a daemon the caller runs: kept
                       env={"PATH": path, "HOME": str(tmp_path), "CUDA_MPS_PIPE_DIRECTORY": "/theirs"})
  assert out.returncode == 0 and "pipe=/theirs" in out.stdout, out.stdout + out.stderr
  assert len(calls.read_text().splitlines()) == 2
  out = subprocess.run(["bash", "-c", f"source {env_sh} && start_mps {tmp_path}/m2; echo rc=$?"],
                       capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
  assert "MPS: nvidia-cuda-mps-control is not on PATH" in out.stdout and "rc=2" in out.stdout


def test_h200_env_detaches_a_run_and_watches_it(tmp_path):
  # DETACH=1 starts the script again in its own session and exits before it ends; WATCH waits
  # for it, shows its log and runs the script's packing command; WATCH with no run says so.
  env_sh = os.path.join(ROOT, "launch", "h200_env.sh")
  script = tmp_path / "job.sh"
  script.write_text(f"source {env_sh}\npack() {{ echo packed; }}\ndetach_or_watch {tmp_path} pack\n"
                    "sleep 2\necho ran with OUT=${OUT:-unset}\n")

  def job(**env):
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "OUT": "o", **env}
    return subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60,
                          env=env)

  none = job(WATCH="5")
  assert none.returncode == 2 and f"WATCH: no detached run in {tmp_path}" in none.stdout
  started = job(DETACH="1")
  assert started.returncode == 0, started.stdout + started.stderr
  assert "detached: pid" in started.stdout
  assert "ran with" not in (tmp_path / "detached.log").read_text()
  watched = job(WATCH="30")
  assert watched.returncode == 0, watched.stdout + watched.stderr
  assert watched.stdout.splitlines() == ["ran with OUT=unset", "the detached run has ended",
                                         "packed"]


def test_medium_pilot_brings_its_corpus_back_and_takes_it_in(tmp_path):
  """STAGE=corpus samples the corpus (the `tiny` size's, from the random tiny teacher) and brings it
  back as pieces; a fresh GRID_DIR given them as CORPUS_IN has the same corpus, complete, with no
  teacher and no sampling; a CORPUS_IN without pieces is refused, naming it."""
  teacher = tmp_path / "unused.gguf"
  teacher.write_bytes(b"")
  env = dict(PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
             HOME=os.environ.get("HOME", "/tmp"), SIZE="tiny", STAGE="corpus", CONTROL="",
             T_LIMIT="300")

  def pilot(grid, out, **more):
    os.makedirs(out, exist_ok=True)
    return subprocess.run(["bash", os.path.join(ROOT, "launch", "medium_pilot_h200.sh")], cwd=ROOT,
                          env={**env, "GRID_DIR": str(grid), "OUT": str(out), **more},
                          capture_output=True, text=True, timeout=600)

  first = pilot(tmp_path / "a", tmp_path / "out", TEACHER_GGUF=str(teacher))
  assert first.returncode == 0 and "corpus complete" in first.stdout, first.stdout + first.stderr
  carried = tmp_path / "carried"
  carried.mkdir()
  for piece in (tmp_path / "out").glob("corpus.tar.xz.part_*"):
    piece.rename(carried / piece.name)
  assert list(carried.iterdir())
  second = pilot(tmp_path / "b", tmp_path / "out2", CORPUS_IN=str(carried))
  assert second.returncode == 0, second.stdout + second.stderr
  assert "corpus from" in second.stdout and "corpus complete" in second.stdout
  first_files = sorted(p.name for p in (tmp_path / "a" / "corpus").iterdir())
  assert first_files == sorted(p.name for p in (tmp_path / "b" / "corpus").iterdir())
  for name in first_files:
    assert (tmp_path / "a" / "corpus" / name).read_bytes() == (tmp_path / "b" / "corpus" / name).read_bytes()
  refused = pilot(tmp_path / "c", tmp_path / "out3", CORPUS_IN=str(tmp_path / "nothing"))
  assert refused.returncode == 2 and "holds no corpus.tar.xz.part_* pieces" in refused.stdout
