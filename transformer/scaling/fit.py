"""Power-law fits of loss against model size, data and compute, with uncertainties.

    L(N)    = E + A · N^(-alpha)                       (Kaplan et al. 2020, eq. 1.1 plus an offset)
    L(N, D) = E + A · N^(-alpha) + B · D^(-beta)       (Hoffmann et al. 2022, eq. 2)

    from transformer import fit
    f = fit.power_law(N, loss)          # {'E': .., 'A': .., 'alpha': .., 'E_err': .., ...}
    fit.predict(f, N)

The fit is linear in E, A (and B) once the exponents are fixed, so a grid over the exponents
with a non-negative linear least-squares fit at each point finds a good start, which
`scipy.optimize.curve_fit` then refines; its covariance gives the standard errors (scaled by
the residual variance, so they are meaningful only with more points than constants).
Sizes are divided by their geometric mean inside the fit to keep it well conditioned; the
returned A, B and their errors are for raw N and D.
"""

from __future__ import annotations

import itertools
import warnings

import numpy as np
from scipy.optimize import OptimizeWarning, nnls
from scipy.optimize import curve_fit as _curve_fit

_EXPONENTS = np.linspace(0.02, 2.0, 100)


def curve_fit(*args, **kwargs):
    with warnings.catch_warnings():  # no covariance with as many points as constants: NaN
        warnings.simplefilter("ignore", OptimizeWarning)
        return _curve_fit(*args, **kwargs)


def _finish(names, p, cov, scales, n_points, residuals, loss):
    """Undo the normalisation: A' (N/s)^-a = A' s^a N^-a, errors by the delta method.
    A term fitted to nothing (its coefficient at the bound 0, e.g. losses that rise with N)
    leaves its exponent undetermined: that exponent's error is nan, not the 0 that
    curve_fit's pseudo-inverse gives a direction the data do not constrain."""
    cov = np.asarray(cov, float) if cov is not None else np.full((len(p), len(p)), np.nan)
    if not np.all(np.isfinite(cov)):
        cov = np.full((len(p), len(p)), np.nan)
    jac = np.eye(len(p))
    values = list(p)
    for coef, expo, scale in scales:  # indices of (coefficient, exponent), and the scale
        factor = scale ** p[expo]
        values[coef] = p[coef] * factor
        jac[coef, coef] = factor
        jac[coef, expo] = p[coef] * factor * np.log(scale)
    errs = np.sqrt(np.abs(np.diag(jac @ cov @ jac.T)))
    for coef, expo, _ in scales:  # p[coef]: the term's size at the geometric-mean N (or D)
        if not p[coef] > 1e-6 * np.mean(np.abs(loss)):
            errs[expo] = np.nan
    out = {name: float(v) for name, v in zip(names, values)}
    out.update({f"{name}_err": float(e) for name, e in zip(names, errs)})
    out["n_points"] = int(n_points)
    out["rmse"] = float(np.sqrt(np.mean(residuals ** 2)))
    return out


def power_law(N, loss) -> dict | None:
    """Fits L(N) = E + A·N^-alpha; None with fewer than 3 distinct N (3 constants)."""
    N, loss = np.asarray(N, float), np.asarray(loss, float)
    if len(set(N)) < 3:
        return None
    scale = float(np.exp(np.mean(np.log(N))))
    x = N / scale

    def model(x, E, A, alpha):
        return E + A * x ** -alpha

    best = None
    for alpha in _EXPONENTS:  # E, A >= 0 by non-negative least squares
        coef, res = nnls(np.stack([np.ones_like(x), x ** -alpha], 1), loss)
        if best is None or res < best[0]:
            best = (res, [coef[0], coef[1], alpha])
    p0 = best[1]
    try:
        p, cov = curve_fit(model, x, loss, p0=p0, maxfev=20000,
                           bounds=([0, 0, 0], [np.inf, np.inf, 5]))
    except (RuntimeError, ValueError):
        p, cov = np.array(p0), None
    if len(N) <= 3:
        cov = None  # an exact fit through 3 points has no error estimate
    return _finish(("E", "A", "alpha"), p, cov, [(1, 2, scale)], len(N),
                   loss - model(x, *p), loss)


def identifiable(N, D) -> bool:
    """Whether L(N, D) = E + A·N^-alpha + B·D^-beta is determined by losses at these points:
    5 constants need 6 points, and each term needs 3 distinct values of its variable. At only
    2 values of D (a ladder at 2 token budgets) the D term and E meet the data as 2 numbers,
    so any beta fits exactly, with a B and E to match: a fit would print an arbitrary beta."""
    return len(N) >= 6 and len(set(np.asarray(N, float))) >= 3 and \
        len(set(np.asarray(D, float))) >= 3


def power_law_nd(N, D, loss) -> dict | None:
    """Fits L(N, D) = E + A·N^-alpha + B·D^-beta; None unless >= 6 points with >= 3 distinct
    values of both N and D (`identifiable`)."""
    N, D, loss = (np.asarray(v, float) for v in (N, D, loss))
    if not identifiable(N, D):
        return None
    sn, sd = (float(np.exp(np.mean(np.log(v)))) for v in (N, D))
    xn, xd = N / sn, D / sd

    def model(X, E, A, alpha, B, beta):
        return E + A * X[0] ** -alpha + B * X[1] ** -beta

    best = None
    coarse = _EXPONENTS[::4]
    for alpha, beta in itertools.product(coarse, coarse):
        design = np.stack([np.ones_like(xn), xn ** -alpha, xd ** -beta], 1)
        coef, res = nnls(design, loss)
        if best is None or res < best[0]:
            best = (res, [coef[0], coef[1], alpha, coef[2], beta])
    p0 = best[1]
    try:
        p, cov = curve_fit(model, np.stack([xn, xd]), loss, p0=p0, maxfev=20000,
                           bounds=([0] * 5, [np.inf, np.inf, 5, np.inf, 5]))
    except (RuntimeError, ValueError):
        p, cov = np.array(p0), None
    return _finish(("E", "A", "alpha", "B", "beta"), p, cov, [(1, 2, sn), (3, 4, sd)],
                   len(N), loss - model(np.stack([xn, xd]), *p), loss)


def predict(f: dict, N, D=None):
    """The fitted loss at N (and D for an L(N, D) fit)."""
    N = np.asarray(N, float)
    out = f["E"] + f["A"] * N ** -f["alpha"]
    if "B" in f:
        out = out + f["B"] * np.asarray(D, float) ** -f["beta"]
    return out


def describe(f: dict, x: str = "N") -> str:
    """'L(N) = 1.52(±0.03) + 41(±9)·N^-0.301(±0.02)' for a fit."""
    def pm(name, fmt):
        return f"{format(f[name], fmt)}(±{format(f[name + '_err'], '.2g')})"
    text = f"L = {pm('E', '.3f')} + {pm('A', '.3g')}·{x}^-{pm('alpha', '.3f')}"
    if "B" in f:
        text += f" + {pm('B', '.3g')}·D^-{pm('beta', '.3f')}"
    return text + f"   [{f['n_points']} points, rmse {f['rmse']:.3g}]"
