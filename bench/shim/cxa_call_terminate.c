/* __cxa_call_terminate for a libstdc++ older than GCC 14's (bench/cpu_vs_llamacpp.py builds and preloads
 * it). llama-cpp-cffi's prebuilt llama.cpp module was compiled with GCC 14, whose code calls
 * __cxa_call_terminate when an exception leaves a noexcept function; Debian 12's libstdc++ (GCC 12)
 * lacks the symbol, so the module does not load. This does what GCC 14's libstdc++ does there: takes
 * the exception as caught and calls std::terminate (which prints it and aborts). It runs only on a
 * path where the process ends anyway. */
void *__cxa_begin_catch(void *exception);
void _ZSt9terminatev(void) __attribute__((noreturn)); /* std::terminate() */

void __cxa_call_terminate(void *exception);
void __cxa_call_terminate(void *exception)
{
    if (exception)
        __cxa_begin_catch(exception);
    _ZSt9terminatev();
}
