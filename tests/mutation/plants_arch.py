"""Planted bugs for issue 35 (the right architecture): each turns off one platform guard, the
k8s arch term or select's platform check."""

K8S = ("tests/render/test_k8s_arch.py",)
SELECT = ("tests/ops/test_select_platform.py",)

PLANTS = [
    dict(name="arch: k8s affinity terms without kubernetes.io/arch", path="render/context.py",
         old="    terms = [arch + term + fit for term in terms]",
         new="    terms = [term + fit for term in terms]", first=K8S),
    dict(name="arch: only the first affinity term carries kubernetes.io/arch", path="render/context.py",
         old="    terms = [arch + term + fit for term in terms]",
         new="    terms = [(arch if i == 0 else []) + term + fit for i, term in enumerate(terms)]",
         first=K8S),
    dict(name="arch: select skips the platform check", path="ops/select.py",
         old="    candidate.verdicts.append(platform_verdict(image_platform(image.labels, image.config_platform),\n"
             "                                               host.platform, host.platform_seen))\n",
         new="", first=SELECT),
    dict(name="arch: select --gpu judges by this machine, not the GPU's CPU", path="ops/select.py",
         old="        cpu = found.cpu_arch\n", new="        cpu = machine()\n", first=SELECT),
]
