# package marker: Cython finds the .pxd files below by module name (engine.<layer>.<name>) on the include path pyx/
