"""A run's place in the model folder: claimed under the folder's lock, its
export saved staged, and, once evaluated, published as the next version
with its report and the run's files; a run that fails or is killed leaves
the previous one's files as they were (``trainer.runs``)."""
import contextlib
import logging
import posixpath
import time

import tensorflow as tf

import cli
from schemas import raw
from serving import exports
from trainer import data as data_lib
from trainer import evaluate
from trainer import export
from trainer import fitting
from trainer import lock
from trainer import runs
from trainer import settings as settings_lib


@contextlib.contextmanager
def claimed(model_dir: str, data: data_lib.PreprocessedData):
  """The run's folders (``runs.Run``) in ``model_dir``, held under its lock
  with what killed runs left swept away; discarded when the run fails, and
  the folder too where this run made it."""
  runs.check_own(model_dir)
  made = not tf.io.gfile.exists(model_dir)
  tf.io.gfile.makedirs(model_dir)
  with lock.exclusive(model_dir, made_for_this_run=made):
    runs.sweep(model_dir)
    runs.copy_report(model_dir)
    run_folders = runs.Run(model_dir)
    try:
      yield run_folders
    except BaseException as error:
      run_folders.discard()
      if isinstance(error, Exception) and not isinstance(error, cli.JobError):
        # A republished data folder fails the export or its evaluation in
        # many ways (labels that no longer match, say): say that, not them.
        data.check_unchanged()
      raise


def save(trained: fitting.Trained, settings: settings_lib.Settings,
         data: data_lib.PreprocessedData, run_folders: runs.Run) -> None:
  """The export, staged, with what it was trained on and how."""
  export.save(trained.model, data.tft_output, data.label_names,
              run_folders.export, {
                  'training': {
                      **settings.record(),
                      'epochs_run': sum(trained.epochs_run.values()),
                      'epochs_run_by_branch': trained.epochs_run,
                      'training_seconds': round(trained.seconds, 1),
                      'run_id': run_folders.run_id,
                      'choices': trained.choices,
                  },
                  'preprocessing': data.params,
                  'data_stats': data.stats,
                  'calibration': trained.calibration,
              })


def publish(evaluation: evaluate.Evaluation,
            data: data_lib.PreprocessedData, run_folders: runs.Run) -> str:
  """The evaluated export put in place as the next version, with its
  report, and the run's files in place of the previous run's; returns the
  version's folder."""
  data.check_unchanged()
  version = run_folders.next_version()
  exports.add_metadata(run_folders.export, {
      'version': version,
      'preprocessing_fingerprint': data.fingerprint})
  # The report goes with the version, so that a version never lacks its
  # report, nor the report its version.
  evaluate.write_report(
      runs.report_dir(run_folders.export), evaluation,
      exports.read_metadata(run_folders.export),
      posixpath.join(run_folders.scratch, evaluate.HISTORY_FILE))
  return run_folders.publish(version)


def log_summary(trained: fitting.Trained, evaluation: evaluate.Evaluation,
                export_dir: str, model_dir: str, started: float) -> None:
  validation = evaluation.metrics[raw.VALIDATION]
  test = evaluation.metrics[raw.TEST]
  logging.info(
      'train: %d epochs in %.0f s (total %.0f s); validation accuracy %.4f; '
      'test accuracy %.4f, macro F1 %.4f on %d examples; export %s; report %s',
      sum(trained.epochs_run.values()), trained.seconds,
      time.time() - started, validation['accuracy'], test['accuracy'],
      test['macro_f1'], test['examples'], export_dir,
      posixpath.join(model_dir, evaluate.REPORT_FILE))
