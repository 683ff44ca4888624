"""Devices the executor runs on: the plain CPU, the CPU-emulated accelerator, CUDA.

Importing this package never touches CUDA.
"""

from outcore.runtime.devices.base import Device, SyncCPUDevice
from outcore.runtime.devices.cuda import CudaDevice
from outcore.runtime.devices.emulated import EmulatedDevice
from outcore.runtime.devices.factory import DEVICES, make_device

__all__ = ["DEVICES", "CudaDevice", "Device", "EmulatedDevice", "SyncCPUDevice", "make_device"]
