"""Burn SHARE of one core (busy SHARE x 10 ms of every 10 ms) for SECONDS, then exit: the CPU that two more service
replicas take, without their routing. Usage: burn.py SHARE SECONDS"""
import sys
import time

share, seconds = float(sys.argv[1]), float(sys.argv[2])
end = time.monotonic() + seconds
while (now := time.monotonic()) < end:
    busy_until = now + share * 0.01
    while time.monotonic() < busy_until:
        pass
    time.sleep(max(0.0, 0.01 - share * 0.01))
