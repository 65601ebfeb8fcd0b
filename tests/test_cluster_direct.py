"""The faults a run on the multi-process DirectRunner meets: its SDK worker
processes killed, its launcher killed (make test-runners)."""
import os
import signal
import threading

import pytest

from schemas import scored
from tests import runner_checks

pytestmark = pytest.mark.runners

MULTI_PROCESS = ['--runner=FnApiRunner',
                 '--direct_running_mode=multi_processing',
                 '--direct_num_workers=2']


def workers_run(_, launcher):
  return any('sdk_worker_main' in runner_checks.command_line(pid)
             for pid in runner_checks.descendants(launcher.pid))


@pytest.mark.parametrize('signum', [signal.SIGTERM, signal.SIGKILL],
                         ids=['sigterm', 'sigkill'])
def test_a_stopped_launcher_stops_its_workers(trained, tmp_path, signum):
  runner_checks.a_fault_ends_the_run(MULTI_PROCESS, trained, tmp_path,
                                     runner_checks.signalled(signum),
                                     running=workers_run)


def test_a_killed_worker_loses_no_document(trained, tmp_path):
  """FnApiRunner runs the bundles of a worker process that died again in
  another: the run publishes every document once."""
  model_dir, _, _ = trained
  documents = 20_000
  corpus = runner_checks.write_jsonl(
      tmp_path / 'docs.jsonl', runner_checks.synthetic_reviews(documents, 44))
  launcher = runner_checks.start_scoring(
      [f'--input={corpus}', f'--model_dir={model_dir}',
       f'--output_dir={tmp_path / "scores"}', *MULTI_PROCESS])
  said = []
  reading = threading.Thread(target=lambda: said.extend(launcher.stderr))
  reading.start()
  runner_checks.wait_for(lambda: workers_run(None, launcher) or
                         launcher.poll() is not None)
  worker = next(pid for pid in runner_checks.descendants(launcher.pid)
                if 'sdk_worker_main' in runner_checks.command_line(pid))
  os.kill(worker, signal.SIGKILL)
  launcher.wait(timeout=600)
  reading.join(timeout=120)
  assert launcher.returncode == 0, ''.join(said)[-3000:]
  ids = [row[scored.ID] for row in runner_checks.scored_rows(tmp_path / 'scores')]
  assert len(ids) == len(set(ids)) == documents
