/**
 * The panel's icon: a scheduler above a rack of workers (three rows with
 * status lights), drawn in the theme's icon colour so it follows light and
 * dark themes like JupyterLab's own icons.
 */
import { LabIcon } from '@jupyterlab/ui-components';

const CLUSTER_SVG = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <path d="M9 1.5h6a1 1 0 0 1 1 1v3a1 1 0 0 1-1 1H9a1 1 0 0 1-1-1v-3a1 1 0 0 1 1-1z"/>
    <path d="M11.3 6.5h1.4v2.5h-1.4z"/>
    <path d="M4 9h16a1 1 0 0 1 1 1v2.5a1 1 0 0 1-1 1H4a1 1 0 0 1-1-1V10a1 1 0 0 1 1-1zm0 5.5h16a1 1 0 0 1 1 1V18a1 1 0 0 1-1 1H4a1 1 0 0 1-1-1v-2.5a1 1 0 0 1 1-1zm0 5.5h16a1 1 0 0 1 1 1v.5a1 1 0 0 1-1 1H4a1 1 0 0 1-1-1V21a1 1 0 0 1 1-1z"/>
  </g>
  <g class="jp-icon-accent0" fill="#fff">
    <circle cx="17.5" cy="11.25" r="0.9"/><circle cx="17.5" cy="16.75" r="0.9"/>
    <path d="M5 11h8v.6H5zM5 16.5h8v.6H5z"/>
  </g>
</svg>`;

/** The panel's icon in the left sidebar. */
export const clusterIcon = new LabIcon({ name: 'jupyter-cluster:cluster', svgstr: CLUSTER_SVG });
