"""A fake sink for the sink-process tests (tests/ on PYTHONPATH: the tests set it for the child).

``file_sinks(path, fail_open=False, open_delay_s=0)`` is a ``SinkProcess`` factory: one sink named TensorBoard that appends each row
it writes to ``path`` as a JSON line ``[step, record]`` and a last line ``"closed"`` when closed; with ``fail_open``
its start raises ``RuntimeError("no writer here")``; ``open_delay_s`` makes its start that much slower (a slow
TensorBoard import).
"""
import json
import time

from fastrl.run.logger import BackgroundSink


def file_sinks(path: str, fail_open: bool = False, open_delay_s: float = 0.0) -> list:
    def open_sink():
        time.sleep(open_delay_s)
        if fail_open:
            raise RuntimeError("no writer here")
        return open(path, "a")

    def write(out, record, step):
        out.write(json.dumps([step, record]) + "\n")

    def finish(out):
        out.write('"closed"\n')
        out.close()

    return [BackgroundSink("TensorBoard", open_sink, write, finish)]
