"""Build the Cython hot paths: every pyx/<package>/<name>.pyx becomes the extension engine.<package>.<name>.

ENGINE_NO_EXTENSIONS=1 at build time skips compiling (pure-Python install); at import time
it forces the pure-Python twins even when the extensions are built.
"""
import glob
import os

from setuptools import setup

#: modules whose C layout (their .pxd) another module compiles against: built together, so that a partial
#: developer build (ENGINE_BUILD_ONLY) never leaves engine.registry._rules or engine.http2._core reading a stale layout
LAYOUT_GROUPS = ({"_heartbeat", "_channel_table", "_intern", "_rules"}, {"_hpack", "_core"})


def _build_only(names: str) -> set:
    only = set(names.split(","))
    return only.union(*(group for group in LAYOUT_GROUPS if only & group))


ext_modules = []
if not os.environ.get("ENGINE_NO_EXTENSIONS"):
    import numpy
    from Cython.Build import cythonize
    from setuptools import Extension

    sanitize = os.environ.get("ENGINE_SANITIZE")  # e.g. "address,undefined" for the ASan/UBSan build
    cflags = ["-O3"] + ([f"-fsanitize={sanitize}", "-fno-omit-frame-pointer", "-O1"] if sanitize else [])
    ldflags = [f"-fsanitize={sanitize}"] if sanitize else []
    ext_modules = cythonize(
        [
            Extension(
                "engine." + os.path.splitext(os.path.relpath(path, "pyx"))[0].replace(os.sep, "."),
                [path],
                include_dirs=[numpy.get_include(), "pyx"],
                define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
                extra_compile_args=cflags,
                extra_link_args=ldflags,
            )
            for path in sorted(glob.glob("pyx/*/*.pyx"))
            # ENGINE_BUILD_ONLY=_frame,_heartbeat limits an in-place developer build to those modules (and the rest
            # of a LAYOUT_GROUPS set when it names one of it)
            if not os.environ.get("ENGINE_BUILD_ONLY")
            or os.path.splitext(os.path.basename(path))[0] in _build_only(os.environ["ENGINE_BUILD_ONLY"])
        ],
        compiler_directives={"language_level": "3", "embedsignature": True},
        # the .pxd files are laid out as the engine package under pyx/engine/ (pyx/engine/codec/_heartbeat.pxd
        # declares engine.codec._heartbeat): Cython finds them by module name on this include path
        include_path=["pyx"],
    )

setup(ext_modules=ext_modules)
