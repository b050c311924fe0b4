"""The Prometheus exporter: per-GPU and per-pod GPU metrics served from a background snapshot.

:mod:`~kubegpu.exporter.refresher` reads NVML, the kubelet's PodResources API and ``/proc`` off
the scrape path; :mod:`~kubegpu.exporter.collector` turns the latest snapshot into samples;
:mod:`~kubegpu.exporter.server` serves ``/metrics`` and ``/healthz`` from the sources it is
handed (:func:`~kubegpu.exporter.server.start_exporter`). Which sources those are is the roles'
choice (:mod:`kubegpu.roles.exporter`: ``start_agent_exporter`` for the node agent's
``--exporter``, ``start_node_exporter`` for ``kubegpu exporter``). A node agent whose exporter
is off imports none of this package; its probes are served by :mod:`~kubegpu.httpd`.

Metric catalogue. GPU labels: ``node``, ``gpu`` (index), ``uuid``, ``model``; pod metrics add
``namespace``, ``pod`` (and ``container``). A value the driver does not report is absent.

=============================================== ======= ===================================
name                                            type    meaning
=============================================== ======= ===================================
kubegpu_gpu_info{pci_bus_id,driver_version}     gauge   1 per GPU (static facts)
kubegpu_gpu_utilization_ratio                   gauge   kernel busy time, 0..1
kubegpu_gpu_memory_used_bytes                   gauge   memory in use
kubegpu_gpu_memory_total_bytes                  gauge   memory in total
kubegpu_gpu_temperature_celsius                 gauge   core temperature
kubegpu_gpu_power_watts                         gauge   power draw
kubegpu_gpu_sm_clock_hertz                      gauge   SM clock
kubegpu_gpu_ecc_errors_total{type}              counter corrected / uncorrected, volatile
kubegpu_gpu_xid_errors_total{xid}               counter Xids seen since its process start
kubegpu_gpu_healthy                             gauge   1 healthy, 0 critical Xid / lost
kubegpu_gpu_allocated_memory_bytes              gauge   granted to pods (whole or shares)
kubegpu_gpu_allocated_compute_ratio             gauge   granted compute, 1 = whole GPU
kubegpu_gpu_unattributed_memory_used_bytes      gauge   used by processes of no known pod
kubegpu_pod_gpu_allocated{container}            gauge   device IDs of the GPU held
kubegpu_pod_gpu_memory_used_bytes               gauge   the pod's processes' memory
kubegpu_pod_gpu_memory_share_bytes              gauge   the pod's memory share
kubegpu_pod_gpu_over_share                      gauge   1 when used > share, else 0
kubegpu_pod_gpu_share_mismatch                  gauge   1 when slots held lack a decision
kubegpu_exporter_snapshot_age_seconds           gauge   age of the served snapshot
kubegpu_exporter_last_refresh_timestamp_seconds gauge   when the last refresh completed
kubegpu_exporter_refresh_duration_seconds       gauge   how long it took
kubegpu_exporter_refresh_failures_total{stage}  counter nvml_timeout, nvml_busy, ...
=============================================== ======= ===================================
"""
