"""Human units at the edge, SI inside: the one place conversions happen."""

BITS_PER_BYTE = 8
BYTES_PER_GIB = 2**30


def gbps_to_bytes_per_s(gbps: float) -> float:
    """10^9 bit/s (network line rates) to bytes/s."""
    return gbps * 1e9 / BITS_PER_BYTE


def gbytes_per_s_to_bytes_per_s(gbytes_per_s: float) -> float:
    return gbytes_per_s * 1e9


def us_to_s(us: float) -> float:
    return us * 1e-6


def tflops_to_flops_per_s(tflops: float) -> float:
    return tflops * 1e12


def bytes_to_gib(num_bytes: float) -> float:
    return num_bytes / BYTES_PER_GIB
