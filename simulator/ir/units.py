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


def count_text(n: float) -> str:
    """A large count as people in the field write it: 300e9 -> "300B", 1.5e12 -> "1.5T",
    2048 -> "2,048"."""
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M")):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{suffix}"
    return f"{n:,.0f}"
