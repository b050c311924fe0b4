#!/bin/sh
# Makes an admission webhook's serving certificate with a throwaway CA, stores it as the Secret
# <name>-tls in namespace kubegpu and prints the caBundle to put into the component's webhook.yaml
# (base64 of ca.crt). <name> is the webhook's Service: kubegpu-peer-webhook (peer-compat) or
# kubegpu-claim-budget (claim-budget); each component's make-certs.sh passes its own.
# Needs openssl and kubectl; run it before `kubectl apply -k` of an overlay with the component.
set -eu
service=${1:?usage: webhook-certs.sh SERVICE-NAME}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
name=$service.kubegpu.svc
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 825 \
  -subj "/CN=$service-ca" -keyout "$dir/ca.key" -out "$dir/ca.crt" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$name" \
  -keyout "$dir/tls.key" -out "$dir/tls.csr" 2>/dev/null
printf 'subjectAltName=DNS:%s,DNS:%s.cluster.local\nextendedKeyUsage=serverAuth\n' "$name" "$name" \
  > "$dir/ext"
openssl x509 -req -in "$dir/tls.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial \
  -days 825 -extfile "$dir/ext" -out "$dir/tls.crt" 2>/dev/null
kubectl create namespace kubegpu --dry-run=client -o yaml | kubectl apply -f -
kubectl -n kubegpu create secret tls "$service-tls" \
  --cert="$dir/tls.crt" --key="$dir/tls.key" --dry-run=client -o yaml | kubectl apply -f -
echo "caBundle: $(base64 -w0 < "$dir/ca.crt")"
