"""`rtc-omni bench`: latency, interrupt, capacity and side-by-side figures measured over 127.0.0.1.

One implementation for the CLI and the scripts in `benchmarks/`: every measurement starts
`rtc-omni serve` as a subprocess and drives it with the headless aiortc peers of `rtc_omni.client`.
"""
