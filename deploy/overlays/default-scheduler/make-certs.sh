#!/usr/bin/env bash
# Certificates for the default-scheduler overlay, written to DIR (default: ./kubegpu-certs):
#   ca.crt, ca.key                          the CA (keep ca.key offline)
#   tls.crt, tls.key                        the extender's serving certificate, for 127.0.0.1
#                                           (kube-scheduler connects by IP, so the IP must be
#                                           a subject alternative name)
#   scheduler-client.crt, scheduler-client.key   kube-scheduler's client certificate
# Then:
#   kubectl -n kubegpu create secret generic kubegpu-extender-tls \
#     --from-file=DIR/tls.crt --from-file=DIR/tls.key --from-file=DIR/ca.crt
# and copy ca.crt, scheduler-client.crt and scheduler-client.key to /etc/kubernetes/kubegpu/
# on every control-plane node (docs/install.md).
set -euo pipefail

dir=${1:-kubegpu-certs}
days=${DAYS:-825}
bits=${BITS:-3072}
mkdir -p "$dir"
cd "$dir"
umask 077

cat > ca.ext <<'EXT'
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
EXT
cat > server.ext <<'EXT'
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
EXT
cat > client.ext <<'EXT'
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
EXT

openssl req -new -newkey "rsa:$bits" -nodes -subj "/CN=kubegpu-extender-ca" \
  -keyout ca.key -out ca.csr 2>/dev/null
openssl x509 -req -in ca.csr -signkey ca.key -days "$days" -extfile ca.ext -out ca.crt 2>/dev/null

openssl req -new -newkey "rsa:$bits" -nodes -subj "/CN=kubegpu-extender" \
  -keyout tls.key -out tls.csr 2>/dev/null
openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days "$days" \
  -extfile server.ext -out tls.crt 2>/dev/null

openssl req -new -newkey "rsa:$bits" -nodes -subj "/CN=kube-scheduler" \
  -keyout scheduler-client.key -out scheduler-client.csr 2>/dev/null
openssl x509 -req -in scheduler-client.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
  -days "$days" -extfile client.ext -out scheduler-client.crt 2>/dev/null

rm -f ./*.csr ./*.ext ca.srl
chmod 644 ./*.crt
echo "wrote $(pwd)/{ca,tls,scheduler-client}.{crt,key}"
