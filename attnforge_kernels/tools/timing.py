"""GPU time alone: what a benchmark reads where the host's launch gaps would hide the kernels (the
decoding steps' ``--gpu-time``, the dispatch sweep's ``--gpu-time``)."""

from __future__ import annotations


def graph_ms(fn, steps: int = 20, rounds: int = 5) -> float:
    """GPU time of one call of ``fn`` alone, in ms: a CUDA graph of ``steps`` calls, each after
    ``do_bench``'s 256 MB L2 flush, less a graph of the flushes alone (medians of ``rounds``
    replays). No host time and no launch gaps; the warm-up runs on the capture stream, so what a
    kernel keeps per stream (the split scratch) exists before the capture."""
    import statistics

    import torch

    flush = torch.empty(int(256e6 // 4), dtype=torch.int, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graphs = []
    for with_fn in (True, False):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=stream):
            for _ in range(steps):
                flush.zero_()
                if with_fn:
                    fn()
        graphs.append(g)

    def replay_ms(g) -> float:
        times = []
        for _ in range(rounds):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            g.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times)

    for g in graphs:
        g.replay()  # the first replay uploads the graph
    return (replay_ms(graphs[0]) - replay_ms(graphs[1])) / steps
