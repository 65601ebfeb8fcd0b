"""pipeline.watch: what a launcher judges of its job from a cluster's REST
API, here an HTTP server on 127.0.0.1 answering as the Spark driver's does
(the real clusters: make test-runners)."""
import contextlib
import http.server
import json
import threading

from pipeline import watch

_APP = 'app-20261127000000-0000'


@contextlib.contextmanager
def serving(routes):
  """An HTTP server whose GET answers routes[path] as JSON, else 404."""
  class Handler(http.server.BaseHTTPRequestHandler):

    def do_GET(self):  # pylint: disable=invalid-name
      if self.path not in routes:
        self.send_error(404)
        return
      body = json.dumps(routes[self.path]).encode()
      self.send_response(200)
      self.send_header('Content-Length', str(len(body)))
      self.end_headers()
      self.wfile.write(body)

    def log_message(self, *_):
      pass

  server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  try:
    yield f'http://127.0.0.1:{server.server_port}'
  finally:
    server.shutdown()
    server.server_close()


def spark_driver(app_name, executors, done):
  api = '/api/v1/applications'
  return {
      api: [{'id': _APP, 'name': app_name}],
      f'{api}/{_APP}/jobs': [{'jobId': 0, 'numTasks': 8,
                              'numCompletedTasks': done,
                              'status': 'RUNNING'}],
      f'{api}/{_APP}/executors': [{'id': 'driver'}] + executors,
  }


def test_a_port_with_another_applications_driver_judges_nothing():
  """Spark moves a driver's UI off a port in use: the launcher then finds
  another run's driver there, or another server, and must judge nothing
  of its own job by it."""
  with serving(spark_driver('other-run_1', [], 3)) as url:
    assert watch.SparkView(url, 'mine').observe()[0] is None
  with serving({}) as url:
    seen, state = watch.SparkView(url, 'mine').observe()
    assert seen is None and 'does not answer (HTTP Error 404' in state


def test_a_driver_gone_after_it_was_found_is_no_progress():
  view = watch.SparkView('', 'mine')
  with serving(spark_driver('mine_1', [], 3)) as url:
    view._ui_url = url  # pylint: disable=protected-access
    first, _ = view.observe()
  assert first == (1, 3)
  seen, state = view.observe()
  assert seen == ('unreachable',) and 'does not answer' in state


def test_a_live_executor_running_a_task_is_progress():
  running = [{'id': '0', 'activeTasks': 1}]
  with serving(spark_driver('mine_1', running, 3)) as url:
    seen, state = watch.SparkView(url, 'mine').observe()
  assert seen is None
  assert state.endswith('1 executors running 1 tasks; 3 of 8 tasks of 1 '
                        'Spark jobs done')
