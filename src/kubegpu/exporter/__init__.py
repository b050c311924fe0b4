"""The Prometheus exporter: per-GPU and per-pod metrics served from a background snapshot.

:mod:`~kubegpu.exporter.refresher` reads NVML, the kubelet's PodResources API and ``/proc`` off
the scrape path; :mod:`~kubegpu.exporter.collector` turns the latest snapshot into samples;
:mod:`~kubegpu.exporter.server` serves ``/metrics`` and ``/healthz`` and is the entry point the
node agent calls (:func:`~kubegpu.exporter.server.start_exporter`).
"""
