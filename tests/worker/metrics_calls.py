"""One rank of the worker-metrics test: a few calls with INA_METRICS_ADDR set, a JSON
line per call (its counters and breakdown), then what its own metrics endpoint serves.

    INA_METRICS_ADDR=127.0.0.1:PORT python -m tests.worker.metrics_calls \
        --config job.toml --worker-id 0 --calls 3
"""

import argparse
import json
import os
from urllib.request import urlopen

from innet_aggregation.worker.run import make_inputs
from innet_aggregation.worker.session import AggregationSession


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--worker-id", type=int, required=True)
    parser.add_argument("--calls", type=int, default=3)
    args = parser.parse_args()
    host, _, port = os.environ["INA_METRICS_ADDR"].rpartition(":")
    with AggregationSession.from_config(args.config, args.worker_id) as session:
        for rep in range(args.calls):
            session.allreduce(make_inputs(20000, 2, rep, args.worker_id))
            print(json.dumps({"counters": session.last_call.counters.as_dict(),
                              "breakdown": session.last_breakdown.as_dict()}), flush=True)
        url = f"http://{host}:{int(port) + args.worker_id}/metrics"
        with urlopen(url, timeout=5) as reply:
            print(json.dumps({"metrics": reply.read().decode()}), flush=True)


if __name__ == "__main__":
    main()
