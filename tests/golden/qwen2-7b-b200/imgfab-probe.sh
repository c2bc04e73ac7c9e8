#!/bin/bash
# imgfab-probe (rendered by imgfab 0.1.0): check this host against the image's labels.
# Exit 0: fit; 3: the host is wrong; 4: the image is wrong; 5: cannot check (no GPU visible).
exec python3 -m imgfab.in_image.probe --image-json /opt/imgfab/image.json "$@"
