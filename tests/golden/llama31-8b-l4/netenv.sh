# Sourced by build steps that reach the network (rendered by imgfab 0.1.0).
# A CA bundle (--ca-cert) and a pip configuration (--pip-index-url) arrive as BuildKit secrets
# under /run/secrets: present only for the step that mounts them, never in a layer.
if [ -s /run/secrets/ca-cert ]; then
    export PIP_CERT=/run/secrets/ca-cert SSL_CERT_FILE=/run/secrets/ca-cert REQUESTS_CA_BUNDLE=/run/secrets/ca-cert
fi
if [ -s /run/secrets/pip-conf ]; then
    export PIP_CONFIG_FILE=/run/secrets/pip-conf
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
