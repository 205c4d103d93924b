"""Two ``Stream`` trainer ranks in threads, for the tests that kill services under them.

Each rank records every micro-batch it receives: ``got[(epoch, step, dp, micro_batch)]`` is the
list of ``(id, weight)`` rows, ``arrivals[dp]`` the monotonic time of each, ``progress[dp]`` the
count; an exception in a rank lands in ``errors`` instead of being lost in its thread.
"""

from __future__ import annotations

import threading
import time

from mmfeed_trainer.data.stream import Stream


class StreamRanks:
    def __init__(self, urls, job, dp=2, train_s=0.03):
        """urls: one NATS URL for every rank, or a list with one per rank."""
        self.urls = [urls] * dp if isinstance(urls, str) else list(urls)
        self.job, self.dp, self.train_s = job, dp, train_s
        self.got, self.errors = {}, []
        self.progress, self.arrivals = [0] * dp, [[] for _ in range(dp)]
        self.threads = [threading.Thread(target=self._rank, args=(r,), daemon=True) for r in range(dp)]

    def _rank(self, dp):
        try:
            with Stream(self.urls[dp], self.job, dp_rank=dp, mp_rank=0, dp=self.dp, request_timeout_s=5.0,
                        fetch_timeout_s=2.0) as stream:
                for mb in stream:
                    key = (mb["epoch"], mb["step"], dp, mb["micro_batch"])
                    self.got[key] = list(zip(mb["id"], mb["weight"].tolist()))
                    self.arrivals[dp].append(time.monotonic())
                    self.progress[dp] += 1
                    stream.feedback(compute_seconds=0.01, samples=len(mb["id"]))
                    time.sleep(self.train_s)  # training
        except BaseException as err:
            self.errors.append(err)

    def start(self):
        for t in self.threads:
            t.start()
        return self

    def wait_progress(self, n, total, deadline_s=60.0):
        """Until every rank has received n micro-batches (or a rank failed)."""
        deadline = time.monotonic() + deadline_s
        while min(self.progress) < n and not self.errors:
            assert time.monotonic() < deadline, f"no progress: {self.progress} of {total}"
            time.sleep(0.02)

    def join(self, timeout, total, log_tail=lambda: ""):
        """Until both ranks reach the end of the data; fails with the service's log if stuck."""
        for t in self.threads:
            t.join(timeout=timeout)
        assert not any(t.is_alive() for t in self.threads), \
            f"trainers stuck at {self.progress} of {total}: " + log_tail()[-3000:]
        assert not self.errors, self.errors
