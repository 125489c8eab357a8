"""The decoding engine: the loop, the state it keeps on the device, the model runner, CUDA graphs and the
session cache that keeps them across calls, statistics and timers."""
