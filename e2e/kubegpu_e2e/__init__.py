"""The end-to-end suite's harness: builds nothing itself (e2e/components/build.sh does), but
starts real upstream Kubernetes components on this machine, over loopback only, and the kubegpu
roles beside them as host processes."""
