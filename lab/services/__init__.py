"""Local stand-ins of the cloud services the product talks to, as real servers on loopback.

Each module serves one service the way the real one behaves for the operations the product uses (requests checked
against the service's published specs, real status codes, headers and error bodies), so the product's real client
code runs against it. The tests start and stop them; the demo plays its scenes against them. Nothing here listens on
anything but a loopback address.
"""
