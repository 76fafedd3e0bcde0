/*
 * Prints the structure offsets gpuprof needs from one CPython version, compiled against that
 * version's own headers (internal ones included):
 *
 *   cc -I$PREFIX/include/python3.X -I$PREFIX/include/python3.X/internal -o offsets offsets.c
 *
 * The test suite builds and runs it for every installed CPython and compares the output with
 * the tables in src/offsets.rs, so a table can never silently disagree with a real interpreter.
 */
#define Py_BUILD_CORE 1
#include <Python.h>
#include <stddef.h>
#include <stdio.h>
#if PY_MINOR_VERSION >= 11
#include "internal/pycore_frame.h"
#endif
#include "internal/pycore_pystate.h"
#if PY_MINOR_VERSION >= 9
#include "internal/pycore_runtime.h"
#endif
#if PY_MINOR_VERSION <= 10
#include <frameobject.h>
#endif
#if PY_MINOR_VERSION >= 9
#include "internal/pycore_interp.h"
#endif

#define P(name, expr) printf("%s=%zu\n", name, (size_t)(expr))
int main(void)
{
	P("runtime.interpreters_head", offsetof(_PyRuntimeState, interpreters.head));
#if PY_MINOR_VERSION >= 11
	P("interp.threads_head", offsetof(PyInterpreterState, threads.head));
#else
	P("interp.threads_head", offsetof(PyInterpreterState, tstate_head));
#endif
	P("tstate.next", offsetof(PyThreadState, next));
	P("tstate.interp", offsetof(PyThreadState, interp));
	P("tstate.thread_id", offsetof(PyThreadState, thread_id));
#if PY_MINOR_VERSION >= 11
	P("tstate.native_thread_id", offsetof(PyThreadState, native_thread_id));
	P("tstate.datastack_chunk", offsetof(PyThreadState, datastack_chunk));
	P("tstate.datastack_top", offsetof(PyThreadState, datastack_top));
	P("chunk.data", offsetof(_PyStackChunk, data));
#endif
#if PY_MINOR_VERSION >= 13
	P("tstate.frame", offsetof(PyThreadState, current_frame));
#elif PY_MINOR_VERSION >= 11
	P("tstate.frame", offsetof(PyThreadState, cframe));
	P("cframe.current_frame", offsetof(_PyCFrame, current_frame));
#else
	P("tstate.frame", offsetof(PyThreadState, frame));
#endif
#if PY_MINOR_VERSION >= 13
	P("frame.code", offsetof(_PyInterpreterFrame, f_executable));
	P("frame.previous", offsetof(_PyInterpreterFrame, previous));
	P("frame.instr", offsetof(_PyInterpreterFrame, instr_ptr));
	P("frame.owner", offsetof(_PyInterpreterFrame, owner));
#elif PY_MINOR_VERSION >= 11
	P("frame.code", offsetof(_PyInterpreterFrame, f_code));
	P("frame.previous", offsetof(_PyInterpreterFrame, previous));
	P("frame.instr", offsetof(_PyInterpreterFrame, prev_instr));
	P("frame.owner", offsetof(_PyInterpreterFrame, owner));
#else
	P("frame.code", offsetof(PyFrameObject, f_code));
	P("frame.previous", offsetof(PyFrameObject, f_back));
	P("frame.instr", offsetof(PyFrameObject, f_lasti));
#endif
	P("code.firstlineno", offsetof(PyCodeObject, co_firstlineno));
	P("code.filename", offsetof(PyCodeObject, co_filename));
	P("code.name", offsetof(PyCodeObject, co_name));
#if PY_MINOR_VERSION >= 11
	P("code.qualname", offsetof(PyCodeObject, co_qualname));
	P("code.code_adaptive", offsetof(PyCodeObject, co_code_adaptive));
#endif
#if PY_MINOR_VERSION >= 10
	P("code.linetable", offsetof(PyCodeObject, co_linetable));
#else
	P("code.linetable", offsetof(PyCodeObject, co_lnotab));
#endif
	P("unicode.state", offsetof(PyASCIIObject, state));
	P("unicode.length", offsetof(PyASCIIObject, length));
	P("unicode.ascii_size", sizeof(PyASCIIObject));
	P("unicode.compact_size", sizeof(PyCompactUnicodeObject));
	P("bytes.size", offsetof(PyBytesObject, ob_base.ob_size));
	P("bytes.data", offsetof(PyBytesObject, ob_sval));
	P("object.type", offsetof(PyObject, ob_type));
	return 0;
}
