"""The trainer's lock on a model folder: a local one naming its holder, the
object-store one kept fresh and taken when stale, an unreadable one."""
import json
import os
import time

import pytest
import tensorflow as tf

from trainer import lock


def test_the_local_lock_names_its_holder_and_ends_with_the_run(tmp_path):
  with lock.exclusive(str(tmp_path)):
    with pytest.raises(lock.Busy, match=f'pid {os.getpid()}, since '):
      with lock.exclusive(str(tmp_path)):
        pass
  with lock.exclusive(str(tmp_path)):
    pass


def holder(path):
  """The lock file's holder, read as the lock reads it: again where a read
  overlapping the heartbeat's rewrite returns a torn file."""
  return lock._read(path)  # pylint: disable=protected-access


def test_the_object_store_lock_is_a_file_kept_fresh_and_taken_when_stale(
    monkeypatch, tmp_path):
  monkeypatch.setattr(lock, 'SETTLE_SECONDS', 0)
  model_dir = f'ram://{tmp_path}/model'
  path = f'{model_dir}/{lock.LOCK_FILE}'
  tf.io.gfile.makedirs(model_dir)
  with lock.exclusive(model_dir):
    with pytest.raises(lock.Busy, match=f'pid {os.getpid()}, since '):
      with lock.exclusive(model_dir):
        pass
  assert not tf.io.gfile.exists(path)
  monkeypatch.setattr(lock, 'HEARTBEAT_SECONDS', 0.05)
  with lock.exclusive(model_dir):
    written = holder(path)['time']
    deadline = time.time() + 60
    while holder(path)['time'] == written:
      assert time.time() < deadline
      time.sleep(0.05)
  # A dead trainer's lock, not rewritten for longer than STALE_SECONDS.
  with tf.io.gfile.GFile(path, 'w') as handle:
    handle.write(json.dumps({'host': 'gone', 'pid': 1, 'token': 'x',
                             'time': time.time() - lock.STALE_SECONDS - 1}))
  with lock.exclusive(model_dir):
    assert holder(path)['pid'] == os.getpid()


def test_an_unreadable_lock_is_held_until_it_is_stale(tmp_path):
  model_dir = f'file://{tmp_path}'
  path = tmp_path / lock.LOCK_FILE
  path.write_text('{"host": "half-writ')
  with pytest.raises(lock.Busy, match='whose name was unreadable'):
    with lock.exclusive(model_dir):
      pass
  stale = time.time() - lock.STALE_SECONDS - 1
  os.utime(path, (stale, stale))
  with lock.exclusive(model_dir):
    assert holder(str(path))['pid'] == os.getpid()
