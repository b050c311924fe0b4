"""The peer webhook: a mutating admission webhook that makes Volcano- and Aliyun-style pods
kubegpu shares (docs/sharing.md, "Compat modes")."""
