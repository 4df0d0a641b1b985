"""A GLM-5-shaped decode loop that reproduces the incident (a pool-wide KV cast every layer) on any device.

`decodegap.demo.config` is pure Python; the model and runner import torch when used."""

from decodegap.demo.config import FULL, KV_READS, TINY, DemoConfig, make_config

__all__ = ["FULL", "KV_READS", "TINY", "DemoConfig", "make_config"]
