"""The Kubernetes edge of GPU sharing, through lightkube: client construction, the node
inventory publisher, pod allocation patches and bindings, and the list+watch cluster view.
Wire objects (lightkube models, JSON) stop here; callers get :mod:`kubegpu.sharing` values."""
