# shellcheck shell=sh
# Sourced by build steps that reach the network (rendered by imgfab 0.1.0).
# A CA bundle (--ca-cert) and a pip configuration (--pip-index-url) arrive as BuildKit secrets
# under /run/secrets: present only for the step that mounts them, never in a layer.
if [ -s /run/secrets/ca-cert ]; then
    export PIP_CERT=/run/secrets/ca-cert SSL_CERT_FILE=/run/secrets/ca-cert REQUESTS_CA_BUNDLE=/run/secrets/ca-cert
fi
# uv reads no pip.conf: the index it installs the lock from is the pip.conf's index-url
# (the lock's own index otherwise), its timeout the pip.conf's timeout.
IMGFAB_INDEX_URL=https://pypi.org/simple
if [ -s /run/secrets/pip-conf ]; then
    export PIP_CONFIG_FILE=/run/secrets/pip-conf
    conf_index=$(sed -n 's/^index-url *= *//p' /run/secrets/pip-conf | head -n 1)
    IMGFAB_INDEX_URL=${conf_index:-$IMGFAB_INDEX_URL}
    conf_timeout=$(sed -n 's/^timeout *= *//p' /run/secrets/pip-conf | head -n 1)
    if [ -n "$conf_timeout" ]; then
        export UV_HTTP_TIMEOUT="$conf_timeout"
    fi
fi
export IMGFAB_INDEX_URL
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
