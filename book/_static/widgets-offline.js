// Glue between the vendored widget manager and the site (loaded after require.js,
// before embed-amd.js, on pages with saved widget state). Our own code, not vendored.
(function () {
  // 1. embed-amd.js finds its fonts relative to the AMD module id
  //    "@jupyter-widgets/html-manager/dist/...", which RequireJS resolves against
  //    the page's folder. Point that id at the vendored copy next to this file, so
  //    it works from any page and any sub-path the site is served from.
  var here = document.currentScript.src.replace(/[^\/]*$/, "");
  require.config({ paths: { "@jupyter-widgets/html-manager/dist": here + "vendor/html-manager" } });

  // 2. ipywidgets 8 typesets widget labels with the MathJax 2 call
  //    MathJax.Hub.Queue(["Typeset", MathJax.Hub, element]); the site runs
  //    MathJax 3, which has no Hub. Provide that one call on top of MathJax 3.
  function addHub() {
    var mj = window.MathJax;
    if (!mj || !mj.version || mj.Hub) return;
    mj.Hub = {
      Queue: function () {
        for (var i = 0; i < arguments.length; i++) {
          var job = arguments[i];
          if (Array.isArray(job) && job[0] === "Typeset" && job[2]) {
            mj.startup.promise.then(function (el) { return function () { return mj.typesetPromise([el]); }; }(job[2]));
          }
        }
      }
    };
  }
  document.addEventListener("DOMContentLoaded", addHub);
  window.addEventListener("load", addHub);
})();
