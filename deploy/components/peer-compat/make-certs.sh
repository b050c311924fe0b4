#!/bin/sh
# Makes the peer webhook's serving certificate with a throwaway CA, stores it as the Secret
# kubegpu-peer-webhook-tls and prints the caBundle to put into webhook.yaml (base64 of ca.crt).
# Needs openssl and kubectl; run it before `kubectl apply -k` of an overlay with this component.
exec "$(dirname "$0")/../webhook-certs.sh" kubegpu-peer-webhook
