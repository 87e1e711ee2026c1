"""The tf.data service: preprocessing on other processes or machines, TensorFlow's own engine.

    python -m train data-service dispatcher --port 5050
    python -m train data-service worker --port 5051 --dispatcher localhost:5050

A training config with `pipeline.data_service: grpc://HOST:5050` then runs reading,
decoding, caching, shuffling, batching and augmenting on the workers and receives compact
uint8 batches (see train/input/pipeline.py). `pipeline.data_service_mode` picks how workers
share the data: `parallel_epochs` (each worker produces the whole dataset) or
`distributed_epoch` (the shards are split between workers, each example once per epoch).

TensorFlow's servers listen on every interface and offer no bind address, so keep the
ports private: on one machine nothing else is needed, in Docker Compose the services
publish no port, across hosts use a private network or a firewall.
"""

from __future__ import annotations

import signal
import sys

from train.core.quiet import import_tensorflow

LISTEN_WARNING = (
    "note: tf.data service servers listen on all interfaces (TensorFlow has no bind-address option); "
    "keep port {port} private (firewall, private network, or an unpublished Compose port)."
)


def dispatcher(port: int, work_dir: str | None = None) -> None:
    import tensorflow as tf

    config = tf.data.experimental.service.DispatcherConfig(
        port=port, work_dir=work_dir, fault_tolerant_mode=bool(work_dir)
    )
    server = tf.data.experimental.service.DispatchServer(config)
    print(f"tf.data service dispatcher: {server.target}", flush=True)
    print(LISTEN_WARNING.format(port=port), file=sys.stderr, flush=True)
    _serve("dispatcher", server)


def worker(port: int, dispatcher_address: str, advertised_host: str = "localhost") -> None:
    import tensorflow as tf

    address = dispatcher_address.removeprefix("grpc://")
    config = tf.data.experimental.service.WorkerConfig(
        dispatcher_address=address, worker_address=f"{advertised_host}:{port}", port=port
    )
    server = tf.data.experimental.service.WorkerServer(config)
    print(f"tf.data service worker {advertised_host}:{port} -> dispatcher {address}", flush=True)
    print(LISTEN_WARNING.format(port=port), file=sys.stderr, flush=True)
    _serve("worker", server)


STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def _serve(role: str, server) -> None:
    """Serve until the first Ctrl-C or SIGTERM (`docker compose stop`), then exit cleanly.

    `main` blocked both signals before TensorFlow started its threads, and threads inherit
    the mask: a process-directed signal then stays pending until this main thread takes it
    with `sigwait`. Otherwise it could land on one of TensorFlow's threads, and Python, which
    runs handlers only in the main thread, might not notice for minutes (observed: a
    dispatcher that ignored the first SIGTERM). `server` is held until the signal comes.
    """
    received = signal.sigwait(STOP_SIGNALS)
    print(
        f"tf.data service {role} stopped ({signal.Signals(received).name}; {type(server).__name__} closed)", flush=True
    )


class LocalCluster:
    """A dispatcher and `workers` workers in this process: for tests and `make bench`."""

    def __init__(self, workers: int):
        import tensorflow as tf

        service = tf.data.experimental.service
        self.dispatcher = service.DispatchServer(service.DispatcherConfig(port=0))
        address = self.dispatcher.target.split("://", 1)[1]
        self.workers = [service.WorkerServer(service.WorkerConfig(dispatcher_address=address)) for _ in range(workers)]

    @property
    def target(self) -> str:
        return self.dispatcher.target

    def stop(self) -> None:
        for worker in self.workers:
            worker._stop()
        self.dispatcher._stop()

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def main(args) -> int:
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # before TensorFlow starts any thread
    try:
        import_tensorflow()
        if args.role == "dispatcher":
            dispatcher(args.port, args.work_dir)
        else:
            worker(args.port, args.dispatcher, args.advertise)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    return 0
