"""Driver side of the ``simp`` dialect (seed 000): HostVar, kernels, drivers."""

from mplang.backends.simp_driver.base import SimpDriver
from mplang.backends.simp_driver.mem import SimpMemDriver, Simulator, make_simulator
from mplang.backends.simp_driver.values import DriverObject, HostVar

__all__ = ["DriverObject", "HostVar", "SimpDriver", "SimpMemDriver", "Simulator",
           "make_simulator"]
